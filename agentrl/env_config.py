"""`env.*`: the env a run trains on (one Env class by import path, its attributes, the options of
its `load_tasks` for training and evaluation), or with `env=mixture` several of them, each under
its name with a weight (agentrl/mixture.py). agentrl/config.py composes it as `Config.env`; run.py
loads the classes and the tasks through these methods, so a wrong option fails with its path.

    env:                          env:   # env=mixture (configs/env/mixture.yaml)
      _target_: my_env.AddEnv       envs:
      args: {max_turns: 4}            code: {_target_: agentrl.envs.code_exec.CodeExecEnv,
      tasks: {n: 100}                        weight: 3, tasks: {n: 256}}
                                      units: {_target_: agentrl.envs.examples.units.UnitsEnv}
"""

from __future__ import annotations

import difflib
import inspect
import logging
import typing
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
)

from agentrl.config_raw import misread, shown
from agentrl.data import check_tasks
from agentrl.env import Env, ToolEnv
from agentrl.mixture import check_name, check_tools
from agentrl.registry import import_path
from agentrl.tool import Tool
from agentrl.types import ConfigError, Task

log = logging.getLogger(__name__)


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    target: str = Field(alias="_target_", description="import path of the Env subclass")
    args: dict[str, Any] = Field(default_factory=dict, description="Env attributes to override")
    tasks: dict[str, Any] = Field(default_factory=dict, description="kwargs of Env.load_tasks")
    eval_tasks: dict[str, Any] | None = Field(
        None,
        description="kwargs of Env.load_tasks for the evaluation set (trainer.eval.every), e.g. "
        "{split: test} or {seed: 1}; None: drawn from the training tasks' list (and left out of "
        "training unless trainer.eval.split=shared)",
    )

    def load_tasks(
        self, cls: type[Env], evaluation: bool = False, where: str = "env"
    ) -> list[Task]:
        """`cls.load_tasks(**env.tasks)` (or `**env.eval_tasks`), with the options checked first:
        a key the function does not take (`env.tasks.pth`) or a value of the wrong type is a
        ConfigError with its path (`where`: this section's), also when the function swallows
        extra keys with `**_`. A None value means "not set". The list it returns must hold a
        task at least, each with its own id (`data.check_tasks`)."""
        key = "eval_tasks" if evaluation and self.eval_tasks is not None else "tasks"
        kwargs = self.eval_tasks if key == "eval_tasks" else self.tasks
        fn = cls.load_tasks
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # annotations that do not resolve here: check the names only
            hints = {}
        fields: dict[str, Any] = {}
        for name, p in inspect.signature(fn).parameters.items():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            default = ... if p.default is p.empty else p.default
            fields[name] = (hints.get(name, Any), default)
        options = create_model(  # type: ignore[call-overload]
            f"{cls.__name__}Tasks", __config__=ConfigDict(extra="forbid"), **fields
        )
        given = {k: v for k, v in (kwargs or {}).items() if v is not None}
        for name, value in given.items():  # pydantic reads true as 1 and takes NaN
            if name in fields and (why := misread(value, fields[name][0])):
                raise ConfigError(f"{where}.{key}.{name}={shown(value)}: {why}")
        try:
            checked = options.model_validate(given)
        except ValidationError as e:
            lines = []
            for err in e.errors():
                name = ".".join(map(str, err["loc"]))
                if err["type"] != "extra_forbidden":
                    lines.append(f"{where}.{key}.{name}: {err['msg']}")
                    continue
                match = difflib.get_close_matches(name, fields, n=1)
                hint = f"; did you mean {where}.{key}.{match[0]}?" if match else ""
                lines.append(
                    f"{where}.{key}.{name}: unknown option of {cls.__name__}.load_tasks{hint}"
                )
            raise ConfigError(
                f"{'; '.join(lines)} ({cls.__name__}.load_tasks takes: "
                f"{', '.join(fields) or 'nothing'})"
            ) from None
        try:
            tasks = list(fn(**{k: getattr(checked, k) for k in given}))
        except (FileNotFoundError, ValueError) as e:  # a wrong option: its message, by name
            raise ConfigError(f"{where}.{key}: {cls.__name__}.load_tasks: {e}") from None
        tasks = check_tasks(tasks, f"{where}.{key}: {cls.__name__}.load_tasks")
        if cls.start is ToolEnv.start:
            _check_prompts(tasks, cls, f"{where}.{key}")
        return tasks

    def load_class(self, where: str = "env") -> type[Env]:
        if self.target in ("", "???"):
            raise ConfigError(
                f"{where}._target_ is not set: name your Env class, e.g. "
                "env=custom env._target_=my_module.MyEnv"
            )
        cls = import_path(self.target, f"{where}._target_")
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise ConfigError(f"{where}._target_={self.target!r} is not a subclass of agentrl.Env")
        if cls.reward is Env.reward:  # every episode would end reward_error, scored 0
            raise ConfigError(
                f"{where}._target_={self.target!r}: {cls.__name__} does not define reward(); add "
                "`async def reward(self, trajectory) -> float` (or a dict with 'total')"
            )
        for key, value in self.args.items():
            if not hasattr(cls, key):
                settings = [a for a in dir(cls) if a[0] != "_" and not callable(getattr(cls, a))]
                known = ", ".join(settings)
                match = difflib.get_close_matches(key, settings, n=1)
                hint = f"did you mean {where}.args.{match[0]}?" if match else f"it has: {known}"
                raise ConfigError(
                    f"{where}.args.{key}: {cls.__name__} has no attribute {key!r}; {hint}"
                )
            _check_arg(cls, key, value, f"{where}.args.{key}")
        check_env_class(cls, self.args, f"{where}._target_={self.target!r}")
        return cls


def _check_prompts(tasks: list[Task], cls: type[Env], where: str) -> None:
    """ToolEnv.start() sends each task's `prompt` as the user message: it must be text, and some
    (a number, null or a list of chat messages was sent as its Python repr, an empty one as no
    question at all)."""
    for t in tasks:
        prompt = t.data.get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            continue
        fix = "name that field 'prompt'"
        if "prompt" not in t.data:
            what = f"has no 'prompt' (its data: {', '.join(t.data) or 'none'})"
        elif isinstance(prompt, str):
            what, fix = "has an empty 'prompt'", "give it the task's question"
        else:
            what = f"has a 'prompt' that is not text ({prompt!r:.60})"
            fix = "make it the question's text (a list of messages: send them from start())"
        raise ConfigError(
            f"{where}: task {t.id!r} {what}; ToolEnv.start() sends task.data['prompt'] as the "
            f"user message: {fix}, or define {cls.__name__}.start()"
        )


def _check_arg(cls: type[Env], key: str, value: Any, where: str) -> None:
    """`value` against the attribute's annotation (`max_turns: Annotated[int, Field(ge=1)]`), or
    else the type of its default (an int, float, bool or str): a wrong one fails here, by name,
    not in every episode (`env.args.max_turns=four`) or never (`max_turns=0`)."""
    try:
        hint = typing.get_type_hints(cls, include_extras=True).get(key)
    except Exception as e:  # noqa: BLE001 - an annotation that does not resolve at run time
        log.info("%s's annotations do not resolve (%s): %s is checked by its default", cls, e, key)
        hint = None
    default = getattr(cls, key)
    if hint is None or typing.get_origin(hint) is typing.ClassVar:
        kind = type(default)
        hint = (
            {int: int, float: float, bool: bool, str: str}.get(kind)
            if default is not None
            else None
        )
        if hint is None:
            return
    if why := misread(value, hint):  # pydantic reads true as 1 and takes NaN
        raise ConfigError(f"{where}={shown(value)}: {why}")
    try:
        TypeAdapter(hint).validate_python(value)
    except ValidationError as e:
        raise ConfigError(f"{where}={value!r}: {e.errors()[0]['msg']}") from None


class MixtureMember(EnvConfig):
    weight: float = Field(
        1.0,
        allow_inf_nan=False,
        description="this env's share of the tasks drawn: weight / the sum of the envs' weights",
    )

    @field_validator("weight")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(
                "must be > 0 (it is a share of the tasks drawn); to leave this env out, drop it "
                "from the mixture: ~env.envs.<name>"
            )
        return v


class MixtureConfig(BaseModel):
    """env=mixture: several envs in one run, each under its name (agentrl/mixture.py)."""

    model_config = ConfigDict(extra="forbid")

    envs: dict[str, MixtureMember] = Field(
        description="name -> an env's section (_target_, args, tasks, eval_tasks) and its weight"
    )

    @field_validator("envs")
    @classmethod
    def _named(cls, v: dict[str, MixtureMember]) -> dict[str, MixtureMember]:
        if not v:
            raise ValueError("a mixture needs at least one env: env.envs.<name>._target_=…")
        for name in v:
            check_name(name)
        return v

    def load_classes(self) -> dict[str, type[Env]]:
        """Every member's class (`EnvConfig.load_class`, errors at `env.envs.<name>`), checked
        together: a tool name two envs give two meanings is a ConfigError."""
        classes = {name: m.load_class(f"env.envs.{name}") for name, m in self.envs.items()}
        check_tools(classes)
        return classes


def env_kind(v: Any) -> str:
    """Which section `env` is: a mixture when it lists `envs`."""
    if isinstance(v, dict):
        return "mixture" if "envs" in v else "env"
    return "mixture" if isinstance(v, MixtureConfig) else "env"


ENV_KINDS = ("env", "mixture")  # the tags of Config.env's union (left out of error paths)


# what the rollout calls on an Env, with the arguments it passes (after `self`)
_CALLS = {
    "start": ((), "async def start(self) -> list[Message]"),
    "step": ((None,), "async def step(self, turn) -> StepResult"),
    "reward": ((None,), "async def reward(self, trajectory) -> float"),
    "close": ((), "async def close(self) -> None"),
}


def check_env_class(cls: type[Env], args: dict[str, Any], where: str) -> None:
    """What would fail in every episode, found at the door: a method the rollout cannot call with
    its arguments (`async def reward(self)`: every episode `reward_error`; `step(self)`: every
    one `env_error`, scored 0 as if the policy's fault), an `__init__` that does not take the
    task, a `load_tasks` that is not a classmethod, a tool listed as its class."""
    for name, (call_args, form) in _CALLS.items():
        _check_call(getattr(cls, name), (None, *call_args), {}, f"{where}: {cls.__name__}.{name}"
                    f"() cannot be called as the rollout does; write it as `{form}`")  # fmt: skip
    _check_call(cls.__init__, (None, None, None), args, f"{where}: {cls.__name__}.__init__ "
                "cannot take (task, ctx, **env.args); write it as `def __init__(self, task, "
                "ctx=None, **kwargs)` and call super().__init__(task, ctx, **kwargs)")  # fmt: skip
    if not isinstance(inspect.getattr_static(cls, "load_tasks"), classmethod | staticmethod):
        raise ConfigError(f"{where}: {cls.__name__}.load_tasks is not a classmethod (tasks are "
                          "loaded before any episode); put @classmethod above it")  # fmt: skip
    for tool in cls.tools:
        if not isinstance(tool, Tool):
            fix = f"{tool.__name__}()" if isinstance(tool, type) else "a Tool instance"
            raise ConfigError(f"{where}: {cls.__name__}.tools holds {tool!r:.60}, not a Tool "
                              f"instance; list {fix}")  # fmt: skip


def _check_call(fn: Any, call_args: tuple, kwargs: dict[str, Any], message: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return
    try:
        signature.bind(*call_args, **kwargs)
    except TypeError as e:
        raise ConfigError(f"{message} ({e})") from None
