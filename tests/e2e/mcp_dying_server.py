"""An MCP server for tests/e2e/test_mcp_tools.py that dies mid-call (`die`), as a server with a
bug the model's arguments reach does; `pid` tells one process of it from the next."""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("dying")


@server.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
def die() -> str:
    """Exit the process in the middle of the call."""
    os._exit(1)


if __name__ == "__main__":
    server.run("stdio")
