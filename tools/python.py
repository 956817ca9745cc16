"""`python`: run a snippet in the episode's sandbox and show the model what it printed.

The sandbox comes from the ToolContext (one session per trajectory, so variables persist across
turns on backends with sessions); without one, a local `SubprocessSandbox` (rlimits, no isolation)
is used so the tool works on a laptop with nothing else running.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentrl.sandbox.base import ExecResult, Sandbox
from agentrl.sandbox.client import CALL_MARGIN_S
from agentrl.sandbox.subproc import SubprocessSandbox
from agentrl.tool import Tool, ToolContext, ToolResult

_fallback: Sandbox | None = None


def _default_sandbox() -> Sandbox:
    global _fallback
    if _fallback is None:
        _fallback = SubprocessSandbox()
    return _fallback


class PythonTool(Tool):
    name = "python"
    description = (
        "Run Python 3 code and return its stdout and stderr. Print what you want to see. "
        "State persists between calls within one conversation when the sandbox supports it."
    )

    class Args(BaseModel):
        code: str = Field(description="Python source code to execute")

    # the sandbox enforces the timeout on the code once it runs; its queue wait and the HTTP
    # round trip are the service's: the service client gives up after CALL_MARGIN_S with
    # SandboxUnavailable, before this outer deadline could charge the model a timeout
    timeout_grace_s = CALL_MARGIN_S + 15.0

    def __init__(self, stateful: bool = True) -> None:
        self.stateful = stateful

    async def __call__(self, args: PythonTool.Args, ctx: ToolContext) -> ToolResult:
        sandbox = ctx.sandbox or _default_sandbox()
        timeout = self.timeout_s if self.timeout_s is not None else ctx.timeout_s
        res = await sandbox.run(
            args.code, "python", timeout=timeout, session=ctx.session if self.stateful else None
        )
        return ToolResult(
            content=format_result(res, timeout),
            is_error=not res.ok,
            metadata={
                "exit_code": res.exit_code,
                "limit": res.limit,
                "timed_out": res.timed_out,
                "queue_s": res.queue_s,
            },
        )


def format_result(res: ExecResult, timeout: float) -> str:
    parts = []
    if res.stdout:
        parts.append(res.stdout.rstrip("\n"))
    if res.stderr:
        parts.append("stderr:\n" + res.stderr.rstrip("\n"))
    if res.timed_out:
        parts.append(f"[timed out after {timeout:g}s]")
    elif res.limit:
        parts.append(f"[stopped: {res.limit} limit]")
    elif res.exit_code not in (0, None):
        parts.append(f"[exit code {res.exit_code}]")
    return "\n".join(parts) if parts else "[no output]"
