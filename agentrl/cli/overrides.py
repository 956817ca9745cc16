"""Command-line overrides, checked against the config's schema before Hydra composes them.

Left to itself, Hydra answers a key it does not know with "use `+`": the wrong fix for a
misspelt key, and a needless step for a key inside a free-form setting (`env.args.max_turns=6`,
`env.eval_tasks.seed=1`, `rollout.template_kwargs.enable_thinking=false`,
`'engine.ray_resources={rollout: 1}'`). So each plain `key=value` is looked up in the pydantic
models first:

    learner.lrr=1e-5     ConfigError: learner.lrr: unknown key; did you mean learner.lr?
    env=code_exex        ConfigError: env=code_exex: configs/env/ has no code_exex.yaml; did you
                         mean env=code_exec? (choices: code_exec, code_exec_turns, custom, units)
    env.args.max_turns=6 goes to Hydra as ++env.args.max_turns=6 (add or override)
    trainer.eval_every=5 ConfigError: trainer.eval_every moved to trainer.eval.every: write
                         trainer.eval.every=5 (agentrl/trainer_config.py: MOVED_KEYS)

A known key always goes on as `++key=value`: the schema has vouched for it, and the value is
checked in validation (the env's own options by `EnvConfig.load_tasks` and `load_class`). Except
one Hydra reads as a number, a bool or null where the setting takes text only: its text is gone
by validation (`run_name=1e3` is 1000.0), and Hydra would already have named the run's directory
after it, so it is refused here with the quoted form to write:

    run_name=1e3         ConfigError: run_name=1e3: Hydra reads 1e3 as a number (1000.0), and
                         run_name takes text: quote it, run_name="'1e3'" (the shell keeps the
                         inner quotes)

A loss setting the command line's own other settings leave unread is refused too: the composed
config cannot tell it from a default (agentrl/idle_settings.py: unread_overrides):

    algo.loss.ratio=engine algo.loss.rollout_correction=mis
                         ConfigError: algo.loss.rollout_correction=mis does nothing with
                         algo.loss.ratio=engine (…): drop algo.loss.rollout_correction, or set
                         algo.loss.ratio=trainer

`+key`, `++key`, `~key`, `hydra.*` and group paths (`a/b=c`) pass through as written. With
another config directory (`--config-dir`, `--config-path`, `hydra.searchpath`) a top-level name
may be a group of the user's, so group options and unknown top-level names are left to Hydra.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra._internal.utils import get_args_parser  # Hydra's own reading of sys.argv
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from pydantic import BaseModel

from agentrl.config_raw import alternatives, named_sections, sections
from agentrl.idle_settings import unread_overrides
from agentrl.trainer_config import MOVED_KEYS
from agentrl.types import ConfigError


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely misspells, if any is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None


def _keys(model: type[BaseModel]) -> dict[str, Any]:
    """The keys a model takes, with their types: field names and aliases (`_target_`)."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        keys[field.alias or name] = field.annotation
        if not field.alias or model.model_config.get("populate_by_name"):
            keys[name] = field.annotation
    return keys


def unknown_part(schema: type[BaseModel], parts: list[str]) -> tuple[int, list[str]] | None:
    """Where the dotted key `parts` leaves `schema`: the index of the first part it does not
    know and the keys known there; None for a known key (or one inside a free-form setting: a
    dict, a list, the env's options, checked later)."""
    models, named = [schema], False
    for i, part in enumerate(parts):
        if named:  # a name of the user's (env.envs.<name>): any goes
            named = False
            continue
        if not models:
            return None
        keys = {k: t for m in models for k, t in _keys(m).items()}
        if part not in keys:
            return i, list(
                dict.fromkeys(f.alias or n for m in models for n, f in m.model_fields.items())
            )
        models = sections(keys[part])
        if not models and (models := named_sections(keys[part])):
            named = True
    return None


def _inside(schema: type[BaseModel], name: str) -> str | None:
    """'trainer.steps' (or several, 'a.x or b.x') for a top-level `name` that is, or misspells,
    a key one level down."""
    by_leaf: dict[str, list[str]] = {}
    for sec, t in _keys(schema).items():
        for m in sections(t):
            for k in _keys(m):
                by_leaf.setdefault(k, []).append(f"{sec}.{k}")
    leaf = closest(name, by_leaf)
    return " or ".join(by_leaf[leaf][:3]) if leaf else None


def key_hint(parts: list[str], i: int, known: list[str]) -> str:
    """'did you mean learner.lr?' for a misspelt `parts[i]`, else the keys known there."""
    if match := closest(parts[i], known):
        return f"did you mean {'.'.join([*parts[:i], match, *parts[i + 1 :]])}?"
    names = ", ".join(sorted(known))
    names = names if len(names) <= 200 else names[:200].rpartition(", ")[0] + ", …"
    section, rest = ".".join(parts[:i]), ".".join(parts[i:])
    if parts[:i] == ["env"] or (i == 3 and parts[:2] == ["env", "envs"]):  # env.system_prompt=…
        return (f"an attribute of the Env class is {section}.args.{rest}, an option of its "
                f"load_tasks {section}.tasks.{rest}; the keys of {section}: {names}")  # fmt: skip
    return f"the keys of {section or 'the config'}: {names}"


def unknown_key_hint(schema: type[BaseModel], key: str) -> str:
    """'; did you mean learner.lr?' (or the keys known there) for a dotted key `schema` does
    not have; '' for one it has."""
    parts = key.split(".")
    where = unknown_part(schema, parts)
    return f"; {key_hint(parts, *where)}" if where else ""


def setting_type(schema: type[BaseModel], parts: list[str]) -> Any:
    """The annotation of the setting at the dotted key `parts`; None for an unknown key or one
    inside a free-form setting."""
    models, annotation = [schema], None
    for part in parts:
        keys = {k: t for m in models for k, t in _keys(m).items()}
        if part not in keys:
            return None
        annotation = keys[part]
        models = sections(annotation)
    return annotation


def not_text(annotation: Any, value: Any) -> str | None:
    """What Hydra made of an unquoted value (`nan`, `1e3`, `true`, `null`) that a text-only
    setting (`str`, `str | None`) cannot take, e.g. 'a number (1000.0)'; None when it can."""
    kinds = alternatives(annotation)
    if str not in kinds or any(k in kinds for k in (int, float, bool)):
        return None
    if isinstance(value, bool | int | float):
        return f"{'a bool' if isinstance(value, bool) else 'a number'} ({value!r})"
    return "None" if value is None and type(None) not in kinds else None


def check_overrides(
    overrides: list[str], schema: type[BaseModel], config_dir: Path, own_dirs: bool = False
) -> list[str]:
    """`overrides` as Hydra should get them (one for one): a known key as `++key=value`; an
    unknown key or a group option no file provides is a ConfigError naming every such mistake.
    `own_dirs`: the user adds config directories (see the module docstring)."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # not Hydra's grammar: Hydra's own message says where, unless
        if hints := [h for line in overrides if (h := _unquoted(line))]:  # it is this one
            raise ConfigError("invalid override:\n  " + "\n  ".join(hints)) from None
        return list(overrides)
    groups = sorted(p.name for p in config_dir.iterdir() if p.is_dir())
    out, errors = [], unread_overrides(given(parsed))
    for line, o in zip(overrides, parsed, strict=True):
        key = o.key_or_group
        parts = key.split(".")
        if o.type != OverrideType.CHANGE or o.package or "/" in key or parts[0] == "hydra":
            out.append(line)  # +key, ++key, ~key, a group path, Hydra's own settings
            continue
        if len(parts) == 1 and key in groups:
            value = o.value()
            options = sorted(p.stem for p in (config_dir / key).glob("*.yaml"))
            if isinstance(value, str) and value not in options and not own_dirs:
                match = closest(value, options)
                hint = f"; did you mean {key}={match}?" if match else ""
                errors.append(
                    f"{line}: configs/{key}/ has no {value}.yaml{hint} "
                    f"(choices: {', '.join(options)})"
                )
            out.append(line)
            continue
        if key in MOVED_KEYS and unknown_part(schema, parts) is not None:  # an older config's
            new = MOVED_KEYS[key]
            errors.append(f"{key} moved to {new}: write {new}{line[len(key) :]}")
            out.append(line)
            continue
        where = unknown_part(schema, parts)
        if where is not None and len(parts) == 1:
            if own_dirs:  # maybe a group of the user's config directory
                out.append(line)
                continue
            where = (0, list(dict.fromkeys(where[1] + groups)))
            if not closest(key, where[1]) and (inner := _inside(schema, key)):
                errors.append(f"{key}: unknown key; did you mean {inner}?")  # steps=3
                out.append(f"++{line}")
                continue
        if where is not None:
            errors.append(f"{key}: unknown key; {key_hint(parts, *where)}")
        elif what := not_text(setting_type(schema, parts), o.value()):
            text = line.partition("=")[2]
            errors.append(f"{line}: Hydra reads {text} as {what}, and {key} takes text: quote "
                          f"it, {key}=\"'{text}'\" (the shell keeps the inner quotes)")  # fmt: skip
        out.append(f"++{line}")
    if errors:
        raise ConfigError("invalid override:\n  " + "\n  ".join(errors))
    return out


def given(parsed: list[Any]) -> dict[str, Any]:
    """The settings a command line gives a value (`key=v`, `+key=v`, `++key=v`; the last one of
    a key wins, as in Hydra): dotted key -> value as Hydra reads it. A sweep's values are many
    runs' (`-m algo.loss.ratio=trainer,engine`), and a `~key` gives none: left out."""
    return {
        o.key_or_group: o.value()
        for o in parsed
        if o.type != OverrideType.DEL and not o.package and not o.is_sweep_override()
    }


def _unquoted(line: str) -> str | None:
    """The fix for an override Hydra cannot read because its value holds a letter outside ASCII
    (`env.tasks.path=tâches.jsonl`: Hydra's lexer error points at the letter, says no more)."""
    key, sep, value = line.partition("=")
    if not sep or not value or value[0] in "'\"[{" or value.isascii():
        return None
    try:
        OverridesParser.create().parse_overrides([line])
    except HydraException:
        return (f"{line}: Hydra reads a value with letters outside ASCII only in quotes: "
                f"write {key}='{value}' (on the shell's command line: \"{key}='{value}'\")")  # fmt: skip
    return None


def check_argv(argv: list[str], schema: type[BaseModel], config_dir: Path) -> list[str]:
    """A Hydra app's command line (sys.argv[1:]) with its overrides through `check_overrides`;
    flags (`--cfg job`, `-m`, …) stay where they are."""
    args, _ = get_args_parser().parse_known_args(argv)  # the rest: Hydra's to refuse
    own_dirs = bool(args.config_dir or args.config_path) or any(
        o.lstrip("+").startswith("hydra.searchpath") for o in args.overrides
    )
    new = check_overrides(args.overrides, schema, config_dir, own_dirs)
    out, i = [], 0
    for word in argv:  # argparse takes the positionals in order: the overrides, one by one
        if i < len(new) and word == args.overrides[i]:
            word, i = new[i], i + 1
        out.append(word)
    return out
