"""A cancellation from inside a tool's call (a library's task group going down under it, as an
MCP session that died under load did in CI) is the tool's failure, an error observation; the
episode's own cancellation (its group dropped) still goes through."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from agentrl.tool import Tool, ToolContext


class CancelledUnderIt(Tool):
    """Awaits a future that something else cancels, as an MCP client's dying task group does."""

    name = "cancelled_under_it"
    description = "a call whose library cancels it"

    class Args(BaseModel):
        pass

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> str:
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.cancel)
        await fut
        return "never"


class Slow(Tool):
    name = "slow"
    description = "waits"

    class Args(BaseModel):
        pass

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> str:
        await asyncio.sleep(30)
        return "late"


async def test_a_cancellation_inside_the_tool_is_an_error_observation() -> None:
    result = await CancelledUnderIt().invoke({}, ToolContext(session="s", timeout_s=5.0))
    assert result.is_error and "cancelled from inside" in result.content
    assert result.metadata["error"] == "exception"


async def test_the_episodes_own_cancellation_still_cancels() -> None:
    call = asyncio.ensure_future(Slow().invoke({}, ToolContext(session="s", timeout_s=60.0)))
    await asyncio.sleep(0.05)  # the call is under way
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
