"""Two tools of one env with the same name: an MCP server's `submit` beside agentrl's own
SubmitTool. Found by a red-team pass: the env rendered both schemas to the model and ran every
call on the last one listed, without a word; the env class is now refused, naming the tools and
the fix (McpServer.prefix)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrl import Task, ToolEnv
from agentrl.tools.mcp_tools import McpServer, McpTool
from agentrl.tools.submit import SubmitTool

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}


def mcp_tool(name: str, prefix: str = "") -> McpTool:
    spec = SimpleNamespace(name=name, description="the server's", input_schema=SCHEMA)
    return McpTool(McpServer(command=["a-server"], prefix=prefix), spec)


def test_an_env_whose_tools_share_a_name_is_refused_naming_the_fix():
    with pytest.raises(TypeError, match=r"'submit'.*prefix"):

        class Clash(ToolEnv):
            tools = [mcp_tool("submit"), SubmitTool()]

    class Prefixed(ToolEnv):  # a prefix tells them apart
        tools = [mcp_tool("submit", prefix="srv_"), SubmitTool()]

    assert sorted(Prefixed(Task(id="t", data={"prompt": ""})).tool_map) == ["srv_submit", "submit"]
    with pytest.raises(TypeError, match="'submit'"):  # tools given to one env, as a setting
        Prefixed(Task(id="t", data={"prompt": ""}), tools=[SubmitTool(), mcp_tool("submit")])
