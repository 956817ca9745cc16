"""A config as Hydra composed it, before pydantic validates it (agentrl/config.py: validate).

`import_user_modules`: the env's module is imported first, so that the names it registers are
known to the validators. `misread_settings`: values YAML and Hydra read as something else than
what a number setting means, which pydantic would take without a word:

    trainer.steps=true          pydantic reads true as 1: a run of one step
    learner.lr=inf              the first update fills the weights with NaN
    algo.loss.kl_coef=nan       every loss NaN, every step skipped
    env.args.format_reward=nan  a reward that is not a number

`misread` says why one value cannot be meant for a setting of its type (a true/false where a
number goes, a NaN or an infinity: no setting of agentrl means one, each has its own form of
"off"); `misread_settings` walks a config's sections (a raw dict against its pydantic model)
and returns one line per such value, with its dotted key. Free-form settings (`env.args`,
`env.tasks`: `Any`) are left to their own checks, which call `misread` with their own types.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import types
import typing
from typing import Any

from pydantic import BaseModel

from agentrl.registry import is_import_path


def import_user_modules(raw: dict[str, Any]) -> None:
    """Import the env's module before validating, so names it registers (an estimator, a loss,
    a parser, a sandbox backend: `@ESTIMATORS.register("mine")`) are known to the validators.
    An env that cannot be imported is reported by `env._target_`'s own check."""
    env = (raw.get("env") or {}) if isinstance(raw, dict) else {}
    members = env.get("envs") if isinstance(env, dict) else None  # a mixture's
    sections = list(members.values()) if isinstance(members, dict) else [env]
    for section in sections:
        target = section.get("_target_") if isinstance(section, dict) else None
        if isinstance(target, str) and is_import_path(target):
            module = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
            with contextlib.suppress(Exception):
                importlib.import_module(module)


def alternatives(annotation: Any) -> list[Any]:
    """`A | B`, `Optional[A]`, `Annotated[A, …]` → [A, B]."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return alternatives(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in alternatives(arg)]
    return [annotation]


def misread(value: Any, annotation: Any) -> str | None:
    """Why `value` cannot be meant for a setting annotated `annotation`, or None."""
    kinds = alternatives(annotation)
    numeric = any(k in (int, float) for k in kinds)
    if not numeric or Any in kinds:
        return None
    if isinstance(value, bool) and bool not in kinds:
        return (
            f"a true/false where a number goes (it would be read as {int(value)}): give the number"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return (
            "not a finite number: give one (a setting that can be off says how in its "
            "description: 0, null, or a large number for no limit)"
        )
    return None


def shown(value: Any) -> str:
    """A value as YAML and the command line write it (`true`, not Python's `True`)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def sections(annotation: Any) -> list[type[BaseModel]]:
    return [a for a in alternatives(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]


def named_sections(annotation: Any) -> list[type[BaseModel]]:
    """The sections of a `dict[str, Section]` setting (`env.envs.<name>`)."""
    return [m for a in alternatives(annotation) if typing.get_origin(a) is dict
            for m in sections(typing.get_args(a)[1])]  # fmt: skip


def misread_settings(raw: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """One line per misread value in `raw` (a section as YAML gave it) of `model`'s settings:
    `trainer.steps=true: true where a number goes …`. Keys `model` does not have are left to
    validation, which names them."""
    if not isinstance(raw, dict):
        return []
    fields = {}
    for name, field in model.model_fields.items():
        fields[field.alias or name] = field.annotation
        fields.setdefault(name, field.annotation)
    out: list[str] = []
    for key, value in raw.items():
        if key not in fields:
            continue
        path = f"{where}{key}"
        if isinstance(value, dict):
            for section in sections(fields[key]):
                out += misread_settings(value, section, f"{path}.")
            for section in named_sections(fields[key]):
                for name, member in value.items():
                    out += misread_settings(member, section, f"{path}.{name}.")
        elif why := misread(value, fields[key]):
            out.append(f"{path}={shown(value)}: {why}")
    return list(dict.fromkeys(out))  # a section under two models of a union: once
