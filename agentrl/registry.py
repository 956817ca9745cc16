"""One registry class for everything chosen by name in a config: parsers, advantage estimators,
losses, sandbox backends, weight-sync transports.

    ESTIMATORS = Registry("advantage estimator", setting="algo.advantage.name")

    @ESTIMATORS.register("grpo")
    def grpo(episodes, cfg): ...

    ESTIMATORS.get("grpo")                     # the function
    ESTIMATORS.get("my_pkg.adv:leave_one_out") # an import path works wherever a name does

A name registered twice raises (two plugins fighting over one name is a bug, not an override);
an unknown name raises a ConfigError that names the setting and lists the known names. An import
path `module:attr` (or `module.attr` when no registered name matches) is imported on lookup, so
users extend agentrl from their own modules without editing it; importing that module may
register further names with the same decorator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from agentrl.types import ConfigError

T = TypeVar("T")


def import_path(path: str, setting: str) -> Any:
    """`pkg.module:attr` or `pkg.module.attr` → the object; a ConfigError naming `setting` if not."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError, ValueError) as e:
        top = module.partition(".")[0]
        moved = (
            f"; agentrl's own {top}/ is imported as agentrl.{top} (did you mean agentrl.{path}?)"
            if top in ("envs", "tools", "sandbox")
            else ""
        )
        raise ConfigError(
            f"{setting}={path!r} cannot be imported ({type(e).__name__}: {e}); give "
            f"`module:attr` of something importable from this environment{moved}"
        ) from e


def is_import_path(name: str) -> bool:
    return ":" in name or "." in name


class Registry(Generic[T]):
    """Named entries of one kind. `register(name)` is a decorator; `get(name)` resolves a name or
    an import path; `names()` lists what is known."""

    def __init__(self, kind: str, setting: str) -> None:
        self.kind, self.setting = kind, setting
        self._entries: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: add the function or class under `name` (with optional metadata, e.g. an
        estimator's whitening default). A second registration of the same name raises."""
        if not name or is_import_path(name):
            raise ValueError(f"{self.kind} name {name!r}: use a plain name without '.' or ':'")

        def deco(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice ({_where(self._entries[name])} and "
                    f"{_where(obj)}); pick another name"
                )
            self._entries[name] = obj
            self._meta[name] = meta
            return obj

        return deco

    def get(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if is_import_path(name):
            return import_path(name, self.setting)
        raise ConfigError(
            f"unknown {self.kind} {name!r}; set {self.setting} to one of: "
            f"{', '.join(self.names())}, or an import path `module:attr`"
        )

    def meta(self, name: str) -> dict[str, Any]:
        """The metadata given at registration ({} for import paths)."""
        return self._meta.get(name, {})

    def check(self, name: str) -> str:
        """For a pydantic validator: the name if it resolves (importing an import path), else a
        ValueError with the known names."""
        try:
            self.get(name)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return name

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
