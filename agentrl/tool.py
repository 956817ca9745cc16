"""The Tool contract: a name, a description, a pydantic `Args` model, and an async call.

A complete tool (copy, paste, run):

    import asyncio
    from pydantic import BaseModel, Field
    from agentrl.tool import Tool, ToolContext, ToolResult

    class Add(Tool):
        name = "add"
        description = "Add two integers."

        class Args(BaseModel):
            a: int = Field(description="first addend")
            b: int = Field(description="second addend")

        async def __call__(self, args: "Add.Args", ctx: ToolContext) -> ToolResult:
            return ToolResult(content=str(args.a + args.b))

    tool = Add()
    print(tool.schema())                                          # goes into the chat template's tools=
    print(asyncio.run(tool.invoke({"a": 2, "b": 3}, ToolContext())).content)   # 5

`invoke` validates raw arguments against `Args` and turns bad arguments, timeouts and exceptions
into an error `ToolResult` the model can read (`is_error=True`). The one exception that escapes is
`SandboxUnavailable` (infrastructure down): the rollout ends that episode with
`sandbox_unavailable` instead of blaming the policy.

Whose fault (the whole rule, with the sandbox's side, is in `agentrl/types.py: StopReason`):
bad arguments, an unknown tool and a timeout are the model's (`rollout/tool_errors`);
an exception raised by the tool's own code is the tool's (`rollout/tool_exceptions`, logged once
per tool class with its traceback, and never counted towards the `tool_error` stop). A plain
`def __call__` runs in a worker thread (blocking work is fine there); an `async def __call__`
must not block the event loop: one that holds it past its timeout (a `time.sleep`, a blocking
request) cannot be interrupted, stalls every episode of its group, and is reported as a tool
exception naming the fix (`await asyncio.to_thread(...)`).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError
from pydantic.errors import PydanticInvalidForJsonSchema

from agentrl.sandbox.base import Sandbox, SandboxUnavailable, in_episode
from agentrl.types import Task, unawaited

log = logging.getLogger(__name__)
TOOL_FAULTS = ("exception", "blocked_event_loop")  # metadata["error"] values: the tool's fault
_BLOCK_WARN_S = 0.25  # one synchronous stretch this long stalls every episode of the group
_REQUIRED = {  # what a Tool class must set, and how (the error names it)
    "name": 'name = "my_tool"  (the name the model calls)',
    "description": 'description = "What it does."  (the model reads it in the tool schema)',
    "Args": "class Args(BaseModel): one annotated field per argument (`pass` for none)",
}


def _what_it_is(value: Any) -> str:
    """A coroutine (a forgotten `await`, with the fix) or the value's type."""
    return unawaited(value) or type(value).__name__


class ToolResult(BaseModel):
    content: str
    is_error: bool = False
    # machine-readable details (exit code, limit hit, …) for metrics and rewards; not shown to the model
    metadata: dict[str, Any] = {}
    latency_s: float = 0.0
    # the episode ends once this turn's calls have run (a `submit` tool); Env.step reads it
    ends_episode: bool = False

    @property
    def is_tool_fault(self) -> bool:
        """The tool's own code failed (not the model's call)."""
        return self.metadata.get("error") in TOOL_FAULTS


@dataclass
class ToolContext:
    """What a tool may use during one episode, one context per episode (shared by its tools and
    its env's `self.ctx`). `session` is unique per trajectory; `task` is the episode's task (a
    look-up tool reads its data there); `extra` is the episode's own scratch dict, empty at its
    start, for state a tool keeps across turns (a key-value store) or hands to the env's reward:

        async def __call__(self, args, ctx):
            ctx.extra.setdefault("kv", {})[args.key] = args.value     # this episode's store
            return ToolResult(content="stored")
    """

    session: str = "default"
    sandbox: Sandbox | None = None
    timeout_s: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None


class Tool:
    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    timeout_s: float | None = None  # overrides ToolContext.timeout_s when set
    # seconds the outer deadline allows beyond the timeout, for a tool whose backend enforces
    # the timeout on the work itself and may first queue it (a sandbox service): waiting for a
    # slot is the service's time, so it must not turn into the model's `timeout`. A service
    # that never answers still ends the call (its client raises SandboxUnavailable first).
    timeout_grace_s: ClassVar[float] = 0.0

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if getattr(cls, "__abstractmethods__", None):
            return
        for attr, example in _REQUIRED.items():
            if not hasattr(cls, attr):
                raise TypeError(f"Tool subclass {cls.__name__} must define `{attr}`: {example}")
        _check_args_model(cls)
        _check_name_and_call(cls)
        call = cls.__dict__.get("__call__")
        if call is not None and not inspect.iscoroutinefunction(call):
            cls.__call__ = _in_thread(call)  # type: ignore[method-assign]

    async def __call__(self, args: Any, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError(f"{type(self).__name__} must implement async __call__")

    async def end_episode(self, ctx: ToolContext) -> None:
        """Called by `Env.close` once the episode (`ctx.session`) is over: release what this tool
        holds for it (an MCP server of its own, …). Default: nothing."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema that chat templates render under `tools=`."""
        params = self.Args.model_json_schema()
        params.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    async def invoke(self, raw_args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate, run with a timeout, and never raise (except SandboxUnavailable)."""
        t0 = time.monotonic()
        try:
            args = self.Args.model_validate(raw_args)
            extra = _unknown_keys(self.Args, raw_args)
        except ValidationError as e:
            msg = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or '<args>'}: {err['msg']}" for err in e.errors()
            )
            extra = []
        else:
            msg = "; ".join(f"{k}: unknown argument" for k in extra)
        if msg:
            return ToolResult(
                content=f"Error: invalid arguments for tool '{self.name}': {msg}",
                is_error=True,
                metadata={"error": "invalid_args"},
            )
        timeout = self.timeout_s if self.timeout_s is not None else ctx.timeout_s
        timed = _Timed(no_exit(self(args, ctx)))
        try:
            result = await _within(_of_episode(ctx, timed), timeout + self.timeout_grace_s)
        except SandboxUnavailable:
            raise
        except asyncio.CancelledError as e:
            if _cancelled_here():
                raise  # the episode itself was cancelled (its group dropped): go
            result = _cancelled_inside(self, e)
        except TimeoutError:
            result = ToolResult(
                content=f"Error: tool '{self.name}' timed out after {timeout:g}s",
                is_error=True,
                metadata={"error": "timeout"},
            )
        except Exception as e:  # a tool bug is an observation, not a crashed rollout
            _log_once(type(self), "raised", exc_info=e)
            result = ToolResult(
                content=f"Error: tool '{self.name}' failed: {type(e).__name__}: {e}",
                is_error=True,
                metadata={"error": "exception"},
            )
        if not isinstance(result, ToolResult):
            _log_once(type(self), f"returned {_what_it_is(result)}, not a ToolResult")
            result = ToolResult(
                content=f"Error: tool '{self.name}' failed (returned no ToolResult)",
                is_error=True,
                metadata={"error": "exception"},
            )
        if timed.longest_s > timeout:
            _log_once(type(self), f"blocked the event loop for {timed.longest_s:.1f}s")
            result = ToolResult(
                content=f"Error: tool '{self.name}' timed out after {timeout:g}s",
                is_error=True,
                metadata={"error": "blocked_event_loop", "blocked_s": timed.longest_s},
            )
        elif timed.longest_s > _BLOCK_WARN_S:
            _log_once(type(self), f"blocked the event loop for {timed.longest_s:.2f}s", warn=True)
        result.latency_s = time.monotonic() - t0
        return result


def _check_args_model(cls: type[Tool]) -> None:
    """`Args` is a pydantic model whose JSON schema the chat template can show, else a TypeError
    at the class's definition naming the fix (not an AttributeError at the run's start)."""
    args = cls.Args
    if not (isinstance(args, type) and issubclass(args, BaseModel)):
        raise TypeError(
            f"Tool subclass {cls.__name__}: `Args` must be a pydantic model, not {args!r:.60}; "
            "write `class Args(BaseModel):` with one annotated field per argument"
        )
    try:
        args.model_json_schema()
    except PydanticInvalidForJsonSchema as e:
        raise TypeError(
            f"Tool subclass {cls.__name__}: its Args has no JSON schema for the chat template "
            f"({str(e).splitlines()[0]}); give its fields JSON types (str, int, float, bool, "
            "lists, dicts, other pydantic models)"
        ) from e


def _check_name_and_call(cls: type[Tool]) -> None:
    """A name the model can write in a call, and a `__call__` the framework can call with
    `(args, ctx)`: a `__call__(self, args)` raised out of the step (the episode was `env_error`,
    the policy's), and a tool without one (an `async def run`) failed each call at run time."""
    if isinstance(cls.name, str) and not re.fullmatch(r"[A-Za-z0-9_.-]+", cls.name):
        raise TypeError(f"Tool subclass {cls.__name__}: name {cls.name!r} is not one the model can "
                        "write in a call; use letters, digits, '_', '-' and '.'")  # fmt: skip
    form = "async def __call__(self, args, ctx: ToolContext) -> ToolResult"
    if cls.__call__ is Tool.__call__:
        has = [m for m in ("run", "call", "execute", "forward") if callable(getattr(cls, m, None))]
        hint = f" (it has {has[0]}(): rename it)" if has else ""
        raise TypeError(f"Tool subclass {cls.__name__} must define `{form}`{hint}")
    try:
        inspect.signature(cls.__call__).bind(None, None, None)
    except TypeError as e:
        raise TypeError(f"Tool subclass {cls.__name__}: its __call__ cannot be called with "
                        f"(args, ctx) ({e}); write it as `{form}`") from None  # fmt: skip
    except ValueError:  # no signature to read (a builtin): nothing to check
        pass


def _unknown_keys(model: type[BaseModel], raw: Any) -> list[str]:
    """Keys an `Args` model that does not choose `extra` would silently drop: a misspelt argument
    is an error the model reads (the schema it was shown stays as it is)."""
    if model.model_config.get("extra") is not None or not isinstance(raw, dict):
        return []
    known: set[str] = set()
    for name, f in model.model_fields.items():
        known |= {name, *(a for a in (f.alias, f.validation_alias) if isinstance(a, str))}
    return sorted(str(k) for k in raw if k not in known)


_logged: set[tuple[type, str]] = set()


def _log_once(
    cls: type, what: str, exc_info: BaseException | None = None, warn: bool = False
) -> None:
    """One log line per tool class and kind of fault (with the traceback for an exception)."""
    kind = what.split(" for ")[0].split(" (")[0]
    if (cls, kind) in _logged:
        return
    _logged.add((cls, kind))
    hint = ""
    if "blocked" in what:
        hint = (
            ": an async __call__ must not block (time.sleep, blocking I/O); await "
            "asyncio.to_thread(...) for blocking work, or define a plain `def __call__`"
        )
    msg = f"tool {cls.__name__} {what}{hint} (logged once per tool class)"
    if warn:
        log.warning(msg)
    else:
        log.error(msg, exc_info=exc_info)


def _in_thread(call: Any) -> Any:
    """A plain `def __call__`, run in a worker thread so it cannot block the event loop."""

    @functools.wraps(call)
    async def run(self: Tool, args: Any, ctx: ToolContext) -> ToolResult:
        return await asyncio.to_thread(call, self, args, ctx)

    return run


class _Clock:
    """The time a stretch of this thread's code held it, less what was not its doing: waiting
    for a CPU (the kernel ran other processes: a busy box) and the interpreter's garbage
    collections (triggered by whoever allocated last). A tool that sleeps or does blocking I/O
    still counts in full; a tool that merely ran when the box was busy or the GC struck does
    not (the quick start once reported "blocked the event loop for 0.76s" for the python tool)."""

    gc_s = 0.0  # seconds spent in garbage collection so far, by this process
    _gc_t0 = 0.0

    @classmethod
    def install(cls) -> None:
        if cls._on_gc not in gc.callbacks:
            gc.callbacks.append(cls._on_gc)

    @classmethod
    def _on_gc(cls, phase: str, info: dict) -> None:
        if phase == "start":
            cls._gc_t0 = time.perf_counter()
        elif cls._gc_t0:
            cls.gc_s += time.perf_counter() - cls._gc_t0
            cls._gc_t0 = 0.0

    @staticmethod
    def _waited() -> float:
        """Seconds this thread waited on a run queue (Linux schedstat; 0 elsewhere)."""
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    @classmethod
    def now(cls) -> float:
        return time.perf_counter() - cls._waited() - cls.gc_s


async def no_exit(coro: Any) -> Any:
    """Await `coro`; a SystemExit in it (argparse on bad flags, sys.exit in a CLI wrapper: user
    code a policy's arguments reach) becomes a RuntimeError, its code's failure. asyncio would
    re-raise a SystemExit out of the event loop and end the trainer (a red-team pass)."""
    try:
        return await coro
    except SystemExit as e:
        raise RuntimeError(f"sys.exit({e.code!r}) was called") from None


async def _within(call: Any, seconds: float) -> Any:
    """Await `call` in this task, TimeoutError past `seconds`. Not `asyncio.wait_for`: on
    Python 3.11 it returned the call's result to an episode cancelled (its group dropped) in
    the loop iteration in which the call ended, and the dropped episode ran on."""
    async with asyncio.timeout(seconds):
        return await call


async def _of_episode(ctx: ToolContext, call: Any) -> Any:
    """Await `call` as the episode `ctx.session`'s: a backend whose one-shot calls share a
    machine (e2b) runs them in that episode's sandbox, out of other episodes' reach."""
    with in_episode(ctx.session):
        return await call


async def gather_all(aws: Iterable[Awaitable[Any]]) -> list[Any]:
    """Every result, in order; when one raises (or the caller is cancelled) the others are
    cancelled and waited for before it goes on. `asyncio.gather` alone left them running: a
    turn's other tool calls ran on in the episode's sandbox session after the episode ended
    on one call's SandboxUnavailable, and a group's other episodes after one raised a bug."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _cancelled_here() -> bool:
    """Whether the running task was asked to stop (cancel()), rather than a future it awaited
    being cancelled under it by someone else."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _cancelled_inside(tool: Tool, e: asyncio.CancelledError) -> ToolResult:
    """A cancellation from inside a tool (a library's task group going down under the call: an
    MCP server whose session died under load) is the tool's failure, an observation; escaping,
    it read as the episode's own cancellation and ended it without a reason. The log names
    the canceller where it said who it was (anyio's scopes do) and where it struck."""
    _log_once(type(tool), f"was cancelled from inside ({e.args[0] if e.args else 'no message'})",
              exc_info=e)  # fmt: skip
    return ToolResult(
        content=f"Error: tool '{tool.name}' failed: its call was cancelled from inside the tool",
        is_error=True,
        metadata={"error": "exception"},
    )


class _Timed:
    """Drives a coroutine step by step and records its longest synchronous stretch (how long
    it held the event loop at once, by `_Clock`)."""

    def __init__(self, coro: Any) -> None:
        self.coro, self.longest_s = coro, 0.0
        _Clock.install()

    def __await__(self) -> Generator[Any, Any, Any]:
        send, throw = self.coro.send, self.coro.throw
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = _Clock.now()
            try:
                yielded = throw(error) if error is not None else send(value)
            except StopIteration as stop:
                self.longest_s = max(self.longest_s, _Clock.now() - t0)
                return stop.value
            finally:
                self.longest_s = max(self.longest_s, _Clock.now() - t0)
            try:
                value, error = (yield yielded), None
            except BaseException as e:  # cancellation (the timeout) goes into the coroutine
                value, error = None, e
