"""`submit`: the agent says it is done; the episode ends after this turn.

    from agentrl.tools.submit import SubmitTool
    tools = [BashTool(), EditorTool(), SubmitTool()]

A tool whose result has `ends_episode=True` ends the episode once the turn's calls have run
(`Env.step`, stop reason `completed`); the env grades what the agent left behind (the SWE env:
the repository's changes against its hidden tests). An optional `message` is kept in the
result's metadata for the env's reward or logs, and is not graded by default.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentrl.tool import Tool, ToolContext, ToolResult


class SubmitTool(Tool):
    name = "submit"
    description = "Submit your work when you are done. The episode ends and the work is graded."

    class Args(BaseModel):
        message: str | None = Field(None, description="Optional: a short note on what you did.")

    async def __call__(self, args: SubmitTool.Args, ctx: ToolContext) -> ToolResult:
        return ToolResult(
            content="Submitted.", ends_episode=True, metadata={"message": args.message or ""}
        )
