"""MCP tools: the tools of any MCP server as agentrl tools, through the official `mcp` SDK.

    from agentrl.tools.mcp_tools import McpServer, mcp_tools

    git = McpServer(command=["mcp-server-git", "--repository", "/path/to/repo"])
    class RepoEnv(ToolEnv):
        tools = [*mcp_tools(git), SubmitTool()]

`mcp_tools(server)` starts the server once to list its tools (then stops it) and returns one
agentrl `Tool` per MCP tool: the name (with an optional `prefix`), the description and the
input schema exactly as the server gives them (what the chat template renders), arguments
checked against that schema before a call (a mismatch is an error the model reads). A call's
text content becomes the tool message; images and resources are named, structured content is
JSON when there is no text; a result the server flags `isError` is the model's error; a server
that fails (crashed, unreachable, a protocol error) is the tool's fault (`error: exception`);
one that exits mid-call is started again by the next call.

Lifetime: `scope="run"` (default) keeps one server per event loop for the whole run, started on
the first call; `scope="episode"` starts one per episode (`ToolContext.session`) and stops it
when the episode ends (`Env.close` calls each tool's `end_episode`): for stateful servers. Either
way the server runs on the host, with the host's files and this user's rights: an episode's
server process is its own, its files are not (a git server's commit stays for the next
episode). Give each episode its own directory (`cwd`), or run the server in the sandbox.
Calls go to a server concurrently, each with its own `timeout_s`; a call's text is cut at
`MAX_OUTPUT_CHARS`. The server's start and its tool listing have `start_timeout_s` (an `npx` or
Python server takes seconds to import on a busy host; a short per-call deadline timed out the
listing itself).
`await close_connections()` stops all of the current event loop's servers.
Servers are a command on stdio (`command`, with `env` and `cwd`) or a streamable-HTTP `url`.
Each connection lives in a task of its own, as the SDK's context managers require.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentrl.tool import Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)
MAX_OUTPUT_CHARS = 64 * 1024  # of one call's text, as the sandbox's output_bytes


@dataclass(frozen=True)
class McpServer:
    command: tuple[str, ...] | list[str] | None = None  # stdio: the program and its arguments
    url: str | None = None  # or streamable HTTP
    env: dict[str, str] | None = None
    cwd: str | None = None
    scope: Literal["run", "episode"] = "run"
    timeout_s: float = 30.0  # each call's
    start_timeout_s: float = 60.0  # the server's start and tool listing (at least timeout_s)
    prefix: str = ""  # prepended to each tool's name (two servers with a `search` each)
    key: str = field(default="", compare=False)  # set by mcp_tools: the connections' key

    @property
    def start_s(self) -> float:
        return max(self.timeout_s, self.start_timeout_s)

    def target(self) -> Any:
        from mcp import StdioServerParameters

        if (self.command is None) == (self.url is None):
            raise ValueError("McpServer: give exactly one of command (stdio) or url (HTTP)")
        if self.url is not None:
            return self.url
        cmd = list(self.command or ())
        return StdioServerParameters(command=cmd[0], args=cmd[1:], env=self.env, cwd=self.cwd)


class _CallTimeout(Exception):
    """A call ran past the server's `timeout_s` (its start not counted)."""


class _Connection:
    """One client session, owned by a task of its own; calls reach it through a queue."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lost = False  # the server went away (exited mid-call): the next call starts anew
        self.task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        from mcp import Client

        try:
            # each message's read waits up to the start's bound; `call` holds a call to timeout_s
            async with Client(self.server.target(), read_timeout_seconds=self.server.start_s) as c:
                if not self.ready.done():
                    self.ready.set_result(None)
                while (item := await self.queue.get()) is not None:
                    name, args, fut = item
                    if fut.done():  # its caller gave up while it waited in the queue
                        continue
                    # at once, beside the others: one at a time, a slow call of one episode
                    # timed out the next episode's (a red-team pass); a caller that gives up
                    # cancels its request
                    job = asyncio.ensure_future(self._call(c, name, args, fut))
                    fut.add_done_callback(lambda f, j=job: j.cancel() if f.cancelled() else None)
        except Exception as e:  # noqa: BLE001 - the server did not start or broke
            log.warning("MCP server %s stopped: %s", self.server.key, _causes(e), exc_info=e)
            if not self.ready.done():
                self.ready.set_exception(e)
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if item is not None and not item[2].done():
                    item[2].set_exception(e)
        finally:  # stopped (closed) before it started: its waiting callers hear so at once
            if not self.ready.done():
                self.ready.set_exception(ConnectionError(f"the MCP server {self.server.key} "
                                                         "stopped before it started"))  # fmt: skip

    async def _call(self, c: Any, name: str, args: dict[str, Any], fut: asyncio.Future) -> None:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            result = await c.call_tool(name, args)
        except asyncio.CancelledError:  # its caller gave up, or the session went down under it
            if not fut.done():
                fut.set_exception(ConnectionError(f"the MCP server {self.server.key} stopped"))
            raise
        except Exception as e:  # noqa: BLE001 - the caller reads it
            if isinstance(e, MCPError) and e.error.code == CONNECTION_CLOSED:
                # the server exited or closed its pipe: the tool's fault, never the model's
                # error, and this connection ends so that the next call starts the server again
                # (a red-team pass: every later call of the run read 'Connection closed')
                self.lost = True
                self.queue.put_nowait(None)
                e = ConnectionError(f"the MCP server {self.server.key} closed the connection")
            if not fut.done():
                fut.set_exception(e)
        else:
            if not fut.done():
                fut.set_result(result)

    async def call(self, name: str, args: dict[str, Any]) -> Any:
        """The server's start waits up to `start_s`, the call itself up to `timeout_s`. The
        start is shared: a caller that gives up (its own deadline) must not cancel it for the
        others (a red-team pass: the first call of a run timed out while the server started
        on a busy host, cancelling `ready`, and every later call read 'cancelled')."""
        try:  # asyncio.timeout, in this task: 3.11's wait_for lost the episode's cancel
            async with asyncio.timeout(self.server.start_s):  # when it came as the wait ended
                await asyncio.shield(self.ready)
        except TimeoutError:
            raise ConnectionError(f"the MCP server {self.server.key} did not start within "
                                  f"{self.server.start_s:g}s") from None  # fmt: skip
        if self.task.done() or self.lost:
            raise ConnectionError(f"the MCP server {self.server.key} has stopped")
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((name, args, fut))
        try:
            async with asyncio.timeout(self.server.timeout_s):
                return await fut
        except TimeoutError:
            raise _CallTimeout from None

    async def close(self) -> None:
        if not self.task.done():
            await self.queue.put(None)
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 10)
            except Exception as e:  # noqa: BLE001 - stopping it anyway (cancelled below)
                log.warning("MCP server %s did not stop cleanly: %s", self.server.key, e)
        self.task.cancel()


def _causes(e: BaseException) -> str:
    """An exception, or each leaf of a task group's exception group ('unhandled errors in a
    TaskGroup (1 sub-exception)' named none of them)."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_causes(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


# connections by (server key, episode session or "", event loop)
_CONNECTIONS: dict[tuple[str, str, int], _Connection] = {}


def _connection(server: McpServer, session: str) -> _Connection:
    loop = asyncio.get_running_loop()
    key = (server.key, session if server.scope == "episode" else "", id(loop))
    conn = _CONNECTIONS.get(key)
    if conn is None or conn.task.done() or conn.lost:
        conn = _CONNECTIONS[key] = _Connection(server)
    return conn


class McpTool(Tool):
    """One tool of an MCP server (made by `mcp_tools`)."""

    name = "mcp"
    description = ""

    class Args(BaseModel):
        model_config = ConfigDict(extra="allow")  # the server's schema is the contract

    def __init__(self, server: McpServer, spec: Any) -> None:
        self.server = server
        self.remote = spec.name
        self.name = server.prefix + spec.name  # type: ignore[misc]
        self.description = spec.description or ""  # type: ignore[misc]
        self.input_schema = dict(spec.input_schema or {"type": "object", "properties": {}})
        # the outer bound (Tool.invoke's) holds the server's start and the call; each has its
        # own deadline inside (`_Connection.call`)
        self.timeout_s = server.start_s + server.timeout_s

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.input_schema}}  # fmt: skip

    async def __call__(self, args: McpTool.Args, ctx: ToolContext) -> ToolResult:
        import jsonschema

        raw = args.model_dump()
        try:
            jsonschema.validate(raw, self.input_schema)
        except jsonschema.ValidationError as e:
            where = ".".join(map(str, e.absolute_path)) or "<args>"
            return ToolResult(content=f"Error: invalid arguments for tool '{self.name}': "
                              f"{where}: {e.message}", is_error=True,
                              metadata={"error": "invalid_args"})  # fmt: skip
        try:
            result = await _connection(self.server, ctx.session).call(self.remote, raw)
        except _CallTimeout:
            return ToolResult(content=f"Error: tool '{self.name}' timed out after "
                              f"{self.server.timeout_s:g}s", is_error=True,
                              metadata={"error": "timeout"})  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the server's fault, as a result
            from mcp import MCPError

            if isinstance(e, MCPError):  # the server refused the call (unknown tool, …)
                return ToolResult(content=f"Error: {e}", is_error=True)
            return ToolResult(content=f"Error: the MCP server failed: {type(e).__name__}: {e}",
                              is_error=True, metadata={"error": "exception"})  # fmt: skip
        text = _text(result)
        if len(text) > MAX_OUTPUT_CHARS:  # the sandbox tools cut theirs there; 16 MB took the
            cut = len(text) - MAX_OUTPUT_CHARS  # event loop 28 s to tokenize (a red-team pass)
            text = f"{text[:MAX_OUTPUT_CHARS]}\n[{cut} more characters cut]"
        return ToolResult(content=text, is_error=bool(result.is_error))

    async def end_episode(self, ctx: ToolContext) -> None:
        if self.server.scope != "episode":
            return
        key = (self.server.key, ctx.session, id(asyncio.get_running_loop()))
        conn = _CONNECTIONS.pop(key, None)
        if conn is not None:
            await conn.close()


async def close_connections() -> None:
    """Stop every MCP server this event loop started (the end of a run; run-scoped servers
    otherwise stop when their loop closes)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _CONNECTIONS if k[2] == loop]:
        await _CONNECTIONS.pop(key).close()


def _text(result: Any) -> str:
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource: {res.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) or "[no output]"


def mcp_tools(server: McpServer, only: list[str] | None = None) -> list[McpTool]:
    """List `server`'s tools (starting it once, in a thread of its own, so this works inside a
    running event loop too) and return them as agentrl tools; `only` keeps the named ones."""
    from mcp import Client

    key = server.url or " ".join(server.command or ())
    server = McpServer(**{**server.__dict__, "key": f"{key}|{server.cwd}|{server.scope}"})
    listed: list = []
    failure: list[BaseException] = []

    async def fetch() -> None:
        async with Client(server.target(), read_timeout_seconds=server.start_s) as c:
            listed.extend((await c.list_tools()).tools)

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(fetch(), server.start_s))
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            failure.append(e)

    t = threading.Thread(target=run, name="mcp-list-tools")
    t.start()
    t.join()
    if failure:
        raise RuntimeError(
            f"listing the tools of MCP server {key!r} failed: {failure[0]}"
        ) from failure[0]
    tools = [McpTool(server, spec) for spec in listed if only is None or spec.name in only]
    if only is not None and len(tools) != len(set(only)):
        missing = sorted(set(only) - {t.remote for t in tools})
        raise ValueError(
            f"MCP server {key!r} has no tools {missing}; it has {[s.name for s in listed]}"
        )
    return tools
