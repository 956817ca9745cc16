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
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from sandbox.base import Sandbox, SandboxUnavailable


class ToolResult(BaseModel):
    content: str
    is_error: bool = False
    # machine-readable details (exit code, limit hit, …) for metrics and rewards; not shown to the model
    metadata: dict[str, Any] = {}
    latency_s: float = 0.0


@dataclass
class ToolContext:
    """What a tool may use during one episode. `session` is unique per trajectory."""

    session: str = "default"
    sandbox: Sandbox | None = None
    timeout_s: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)


class Tool:
    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    timeout_s: float | None = None  # overrides ToolContext.timeout_s when set

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if getattr(cls, "__abstractmethods__", None):
            return
        for attr in ("name", "description", "Args"):
            if not hasattr(cls, attr):
                raise TypeError(f"Tool subclass {cls.__name__} must define `{attr}`")

    async def __call__(self, args: Any, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError(f"{type(self).__name__} must implement async __call__")

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
        except ValidationError as e:
            msg = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or '<args>'}: {err['msg']}" for err in e.errors()
            )
            return ToolResult(
                content=f"Error: invalid arguments for tool '{self.name}': {msg}",
                is_error=True,
                metadata={"error": "invalid_args"},
            )
        timeout = self.timeout_s if self.timeout_s is not None else ctx.timeout_s
        try:
            result = await asyncio.wait_for(self(args, ctx), timeout)
        except SandboxUnavailable:
            raise
        except TimeoutError:
            result = ToolResult(
                content=f"Error: tool '{self.name}' timed out after {timeout:g}s",
                is_error=True,
                metadata={"error": "timeout"},
            )
        except Exception as e:  # a tool bug is an observation, not a crashed rollout
            result = ToolResult(
                content=f"Error: tool '{self.name}' failed: {type(e).__name__}: {e}",
                is_error=True,
                metadata={"error": "exception"},
            )
        result.latency_s = time.monotonic() - t0
        return result
