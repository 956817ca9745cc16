"""An MCP server for tests/e2e/test_mcp_tools.py, run over stdio: `python mcp_counter_server.py`.

A counter (state per server process, so per-episode servers are told apart), a tool that reports
an error, one that raises, one that returns no text (structured content only), a slow one and
a loud one."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("counter")
count = 0


@server.tool()
def add(amount: int, note: str = "") -> str:
    """Add `amount` to the counter and return the new value."""
    global count
    count += amount
    return f"{count}{' ' + note if note else ''}"


@server.tool()
def divide(a: float, b: float) -> float:
    """a / b."""
    if b == 0:
        raise ValueError("division by zero")
    return a / b


@server.tool()
def stats() -> dict:
    """The counter as structured data."""
    return {"count": count}


@server.tool()
async def wait(seconds: float) -> str:
    """Wait, as a slow tool does."""
    import asyncio

    await asyncio.sleep(seconds)
    return "waited"


@server.tool()
def shout(chars: int) -> str:
    """A text of `chars` characters."""
    return "x" * chars


if __name__ == "__main__":
    server.run("stdio")
