"""`bash`: a persistent shell in the episode's sandbox, as repository agents use one.

    from agentrl.tools.shell import BashTool
    tools = [BashTool(cwd="/repo", max_output_chars=8000)]

One `bash` process per episode (per `ToolContext.session`), started on the first call inside the
episode's sandbox session: `cd`, `export`, functions and background jobs persist between calls.
Each call runs `command` with stdin from /dev/null and answers with its output (stdout and
stderr merged, in order) and, when it failed, `[exit code N]`. Long output keeps its first and
last halves of `max_output_chars` with a note of what was cut. Past the timeout (the tool's
`timeout_s`, else the context's) the command's processes are killed and the shell carries on (a timeout is the model's error;
a failing command is not: its status is part of the answer);
a shell busy in a builtin loop is restarted and the answer says so. `restart: true` starts a new
shell. The schema is the one common agent scaffolds give their models (`command`, `restart`).

It needs a sandbox with sessions (the service backend, e2b, or your own); the shell itself is
tools/_bash_session.py, sent to the session and run there.
"""

from __future__ import annotations

import ast
import secrets
from pathlib import Path

from pydantic import BaseModel, Field

from agentrl.sandbox.client import CALL_MARGIN_S
from agentrl.tool import Tool, ToolContext, ToolResult

_SOURCE = (Path(__file__).parent / "_bash_session.py").read_text()
KILL_MARGIN_S = 5.0  # the sandbox call outlives the command by this much: the kill, the answer


def session_code(name: str, setup: str, call: str, tag: str) -> str:
    """Code for a sandbox session that defines `name` from `setup` once (again after the
    session restarted), evaluates `call` and prints its repr on one stdout line after `tag`.
    Not the cell's trailing value: a session's result is cut at 8 KB (sandbox/_agent.py), and
    an answer of the default 8,000 characters repr'd past it (newlines, tabs, escapes)."""
    return (
        f"if {name!r} not in globals():\n    exec({setup!r}, globals())\n"
        f"print({tag!r} + repr({call}), flush=True)"
    )


def _answer(stdout: str, tag: str) -> tuple | None:
    """The tuple on the last line of `stdout` that starts with `tag`, or None."""
    line = next((x for x in reversed(stdout.splitlines()) if x.startswith(tag)), None)
    if line is None:
        return None
    try:
        out = ast.literal_eval(line[len(tag) :])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return out if isinstance(out, tuple) else None


async def in_session(
    ctx: ToolContext, what: str, name: str, setup: str, call: str, timeout: float
) -> tuple | ToolResult:
    """Evaluate `call` in the episode's sandbox session (after `setup` defined `name` there):
    the literal tuple it returns, or the error result the model reads (no sandbox; a session
    that failed, reset, or whose helper the policy replaced)."""
    if ctx.sandbox is None:
        return ToolResult(
            content=f"Error: {what} needs a sandbox with sessions (sandbox.backend=service)",
            is_error=True,
            metadata={"error": "exception"},
        )
    tag = f"AGENTRL-ANSWER-{secrets.token_hex(8)} "
    res = await ctx.sandbox.run(
        session_code(name, setup, call, tag), "python", timeout=timeout, session=ctx.session
    )
    out = _answer(res.stdout, tag)
    if out is not None:
        return out
    detail = (res.stderr or res.stdout or "no answer").strip()[-2000:]
    if res.truncated and not res.stderr.strip():
        detail = "the answer was cut by the sandbox's output limit (limits.output_bytes)"
    return ToolResult(
        content=f"Error: {what} did not answer: {detail}",
        is_error=True,
        metadata={"limit": res.limit, "session_reset": res.session_reset},
    )


class BashTool(Tool):
    name = "bash"
    description = (
        "Run a bash command in a persistent shell: the working directory, environment "
        "variables and background jobs carry over between calls. stdin is not available "
        "(interactive programs get end of file). Long output is cut in the middle. "
        "Use restart=true to start a fresh shell."
    )

    class Args(BaseModel):
        command: str | None = Field(None, description="The bash command to run.")
        restart: bool = Field(False, description="Start a new shell (before running command).")

    timeout_grace_s = CALL_MARGIN_S + KILL_MARGIN_S + 15.0

    def __init__(
        self, cwd: str | None = None, max_output_chars: int = 8000, timeout_s: float | None = None
    ) -> None:
        self.cwd = cwd
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s

    async def __call__(self, args: BashTool.Args, ctx: ToolContext) -> ToolResult:
        if not args.command and not args.restart:
            return ToolResult(content="Error: give a command (or restart=true)", is_error=True)
        try:  # JSON's "\ud800" reaches here as a lone surrogate: no shell can be given it
            (args.command or "").encode("utf-8")
        except UnicodeEncodeError as e:
            return ToolResult(
                content=f"Error: the command is not UTF-8 text ({e.reason} at character "
                f"{e.start}); write the characters themselves, not \\ud800-style escapes",
                is_error=True,
            )
        timeout = self.timeout_s if self.timeout_s is not None else ctx.timeout_s
        setup = f"{_SOURCE}\n_agentrl_bash = AgentrlBash({self.cwd!r})\n"
        call = (
            f"_agentrl_bash.run({args.command or ''!r}, {timeout!r}, "
            f"{self.max_output_chars!r}, restart={args.restart!r})"
        )
        got = await in_session(
            ctx, "the shell", "_agentrl_bash", setup, call, timeout + KILL_MARGIN_S
        )
        if isinstance(got, ToolResult):
            return got
        output, status, state = got
        text = str(output).rstrip("\n")
        if state in ("timeout", "restarted"):
            return ToolResult(content=text, is_error=True, metadata={"error": "timeout"})
        if isinstance(status, int) and status != 0 and state == "ok":
            text = f"{text}\n[exit code {status}]" if text else f"[exit code {status}]"
        if state == "started":
            text = "[a new shell was started]"
        # a command that fails (a test run, a grep with no match) is an answer, not the model's
        # error: only a timeout or a shell that would not answer counts against it
        return ToolResult(
            content=text or "[no output]", metadata={"exit_code": status, "state": state}
        )
