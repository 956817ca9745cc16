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

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import Any, Generic, TypeVar

from agentrl.types import ConfigError

T = TypeVar("T")


def import_path(path: str, setting: str) -> Any:
    """`pkg.module:attr` or `pkg.module.attr` → the object; a ConfigError naming `setting` if not:
    a path without a module, a module that cannot be imported or raises while importing (the
    error and its file:line), an attribute it lacks (the closest name it has)."""
    _refuse_a_file_path(path, setting)
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    if not module or not name:
        given = path.strip(".:")  # a class alone (MyEnv) or a module alone (my_env)
        example = f"my_module.{given}" if given[:1].isupper() else f"{given or 'my_module'}.MyEnv"
        raise ConfigError(
            f"{setting}={path!r} names no attribute of a module: give `module.Name` or "
            f"`module:Name` (e.g. {example}, for the class {example.rpartition('.')[2]} "
            f"of {example.partition('.')[0]}.py)"
        )
    try:
        obj: Any = importlib.import_module(module)
    except (ImportError, ValueError) as e:
        missing = isinstance(e, ModuleNotFoundError)
        if missing and e.name and not (module + ".").startswith(e.name + "."):  # one it imports
            raise ConfigError(
                f"{setting}={path!r}: importing {module} needs {e.name!r}, which is not "
                f"installed here ({_raised_at(e)}); install it"
            ) from e
        yours = " (a file of yours: run from its directory, or add that to PYTHONPATH)"
        raise ConfigError(
            f"{setting}={path!r} cannot be imported ({type(e).__name__}: {e}); give "
            f"`module:attr` of something importable from this environment"
            f"{yours if missing else ''}{_moved(module, path)}"
        ) from e
    except Exception as e:  # the module's own code failed: say where, in one line
        raise ConfigError(
            f"{setting}={path!r}: importing {module} raised {type(e).__name__}: "
            f"{e.msg if isinstance(e, SyntaxError) else e} "
            f"({_raised_at(e)}); fix the module"
        ) from e
    parts = name.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            match = difflib.get_close_matches(part, [n for n in dir(obj) if n[0] != "_"], n=1)
            near = ".".join([*parts[:i], *match])
            hint = f"; did you mean {setting}={module}{sep or '.'}{near}?" if match else ""
            raise ConfigError(
                f"{setting}={path!r} cannot be imported: {'.'.join([module, *parts[:i]])} has "
                f"no attribute {part!r}{hint}"
            )
        obj = getattr(obj, part)
    return obj


def _refuse_a_file_path(path: str, setting: str) -> None:
    """`my_env.py:MyEnv`, `./my_env.py`, `/home/me/my_env.py:MyEnv`: a file's path where a
    module's is wanted (it failed as 'no attribute py' or a relative import's TypeError)."""
    file, _, name = path.partition(":")
    if not (file.endswith(".py") or "/" in file or "\\" in file):
        return
    p = PurePath(file)
    module = p.stem if p.suffix == ".py" else p.name
    folder = f"{p.parent}, " if p.parent != PurePath() else ""
    raise ConfigError(
        f"{setting}={path!r} is a file's path; give the module's name and the class: "
        f"{setting}={module}.{name or 'MyEnv'} (run from {folder}the folder of {module}.py, "
        "or add that folder to PYTHONPATH)"
    )


def _moved(module: str, path: str) -> str:
    top = module.partition(".")[0]
    if top in ("envs", "tools", "sandbox"):
        return f"; agentrl's own {top}/ is imported as agentrl.{top} (did you mean agentrl.{path}?)"
    return ""


def _raised_at(e: BaseException) -> str:
    """file:line of a SyntaxError, else of the innermost frame of the traceback."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"


def is_import_path(name: str) -> bool:
    return ":" in name or "." in name


class Registry(Generic[T]):
    """Named entries of one kind. `register(name)` is a decorator; `get(name)` resolves a name or
    an import path; `names()` lists what is known."""

    def __init__(self, kind: str, setting: str, called_with: tuple[str, ...] | None = None) -> None:
        """`called_with`: the arguments each entry is called with, `("episodes", "cfg")`; an
        import path to something that cannot be called so is refused at the door (a class of
        the wrong kind, a function of other parameters was a TypeError at the first step)."""
        self.kind, self.setting, self.called_with = kind, setting, called_with
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
            return self._callable(name, import_path(name, self.setting))
        raise ConfigError(
            f"unknown {self.kind} {name!r}; set {self.setting} to one of: "
            f"{', '.join(self.names())}, or an import path `module:attr`"
        )

    def _callable(self, name: str, obj: Any) -> Any:
        if self.called_with is None:
            return obj
        form = f"fn({', '.join(self.called_with)})"
        try:
            inspect.signature(obj).bind(*self.called_with)
        except TypeError as e:  # not callable, or not with these arguments
            raise ConfigError(
                f"{self.setting}={name!r} is {_what(obj)}, which cannot be called as "
                f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} is, {form} ({e}); give "
                f"`module:attr` of a function called so"
            ) from None
        except ValueError:  # a builtin without a signature: nothing to check
            pass
        return obj

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


def _what(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    return f"a {type(obj).__name__}" if not callable(obj) else f"{_where(obj)}"


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
