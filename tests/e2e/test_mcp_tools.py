"""MCP servers' tools as agentrl tools (tools/mcp_tools.py) with the official SDK: a server
written here (tests/e2e/mcp_counter_server.py, stdio) is listed, called, and its errors come
back as tool results; per-episode servers keep their own state and stop with the episode; a
server that will not start is a clear error; and a real server from PyPI (mcp-server-git)
reads a repository the test made."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.env import ToolEnv
from agentrl.tool import ToolContext
from agentrl.tools.mcp_tools import McpServer, _connection, close_connections, mcp_tools
from agentrl.types import Task, ToolCall

HERE = Path(__file__).parent
COUNTER = McpServer(command=[sys.executable, str(HERE / "mcp_counter_server.py")])


async def test_a_servers_tools_are_listed_called_and_fail_cleanly() -> None:
    tools = {t.name: t for t in mcp_tools(COUNTER)}
    assert sorted(tools) == ["add", "divide", "shout", "stats", "wait"]
    schema = tools["add"].schema()["function"]
    assert schema["parameters"]["required"] == ["amount"] and "counter" in schema["description"]
    ctx = ToolContext(session="one")
    try:
        assert (await tools["add"].invoke({"amount": 2}, ctx)).content == "2"
        r = await tools["add"].invoke({"amount": 3, "note": "more"}, ctx)
        assert (r.content, r.is_error) == ("5 more", False)
        r = await tools["add"].invoke({"amount": "three"}, ctx)  # refused before the server
        assert r.is_error and "amount: 'three' is not of type 'integer'" in r.content
        r = await tools["divide"].invoke({"a": 1, "b": 0}, ctx)  # the tool raised: isError
        assert r.is_error and not r.is_tool_fault
        assert (await tools["divide"].invoke({"a": 1, "b": 4}, ctx)).content == "0.25"
        assert '"count": 5' in (await tools["stats"].invoke({}, ctx)).content  # structured only
    finally:
        await close_connections()
    prefixed = mcp_tools(McpServer(command=COUNTER.command, prefix="c_"), only=["add"])
    assert [t.name for t in prefixed] == ["c_add"]
    with pytest.raises(ValueError, match="no tools"):
        mcp_tools(COUNTER, only=["absent"])
    with pytest.raises(RuntimeError, match="listing the tools of MCP server"):
        mcp_tools(McpServer(command=[sys.executable, "-c", "raise SystemExit(3)"], timeout_s=10))


async def test_calls_of_many_episodes_run_beside_each_other_and_loud_output_is_cut() -> None:
    """A red-team pass: a run-scoped server took calls one at a time, each caller's deadline
    running from the queue, so one episode's two slow calls timed out another episode's quick
    one (its error, though it did nothing wrong); 16 MB of output stalled the event loop."""
    tools = {t.name: t for t in mcp_tools(McpServer(command=COUNTER.command, timeout_s=1.8))}
    try:
        # the server's start has its own deadline (start_timeout_s), not the call's 1.8 s: on
        # a busy host this first call timed out and cancelled the start for every later call
        warm = await tools["add"].invoke({"amount": 0}, ToolContext(session="warm"))
        assert warm.content == "0", warm
        slow = [tools["wait"].invoke({"seconds": 1.0}, ToolContext(session="a")) for _ in range(2)]
        quick = tools["add"].invoke({"amount": 1}, ToolContext(session="b"))
        *waited, added = await asyncio.gather(*slow, quick)
        assert [w.content for w in waited] == ["waited"] * 2 and added.content == "1", added
        loud = await tools["shout"].invoke({"chars": 200_000}, ToolContext(session="c"))
        assert len(loud.content) < 70_000 and "more characters cut" in loud.content
    finally:
        await close_connections()


async def test_a_slow_start_is_shared_and_not_a_calls_timeout() -> None:
    """A server that takes longer to start than one call may run (a busy host): the first call
    waits for the start (start_timeout_s), a caller that gives up during the start does not
    cancel it for the others, and a call past timeout_s is a timeout the model reads."""
    slow_start = [sys.executable, "-c", "import runpy, sys, time; time.sleep(3); "
                  f"sys.argv = [{str(HERE / 'mcp_counter_server.py')!r}]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')"]  # fmt: skip
    tools = {t.name: t for t in mcp_tools(McpServer(command=slow_start, timeout_s=2))}
    try:
        impatient = tools["add"].invoke({"amount": 5}, ToolContext(session="a"))
        with pytest.raises(TimeoutError):  # its caller (an episode) gives up during the start
            await asyncio.wait_for(impatient, 0.2)
        first = await tools["add"].invoke({"amount": 1}, ToolContext(session="b"))
        assert (first.content, first.is_error) == ("1", False), first
        late = await tools["wait"].invoke({"seconds": 8.0}, ToolContext(session="c"))
        assert late.is_error and late.metadata["error"] == "timeout", late
        assert "timed out after 2s" in late.content
        assert (await tools["add"].invoke({"amount": 1}, ToolContext(session="d"))).content == "2"
    finally:
        await close_connections()


class _CancelOnAnswer(asyncio.Queue):
    """A connection's queue that cancels `episode` in the loop iteration in which the server's
    answer to its call arrives (its group dropped just then); `accepted`: what cancel() said."""

    def __init__(self, episode: list[asyncio.Task], accepted: list[bool]) -> None:
        super().__init__()
        self.episode, self.accepted = episode, accepted

    def _put(self, item) -> None:
        if item is not None:
            item[2].add_done_callback(lambda _: self.accepted.append(self.episode[0].cancel()))
        super()._put(item)


async def test_an_episode_cancelled_as_its_answer_arrives_stays_cancelled() -> None:
    """On 3.11 `asyncio.wait_for` around the call returned the answer to an episode whose
    cancel it had accepted, and the dropped episode went on to its next turn."""
    (tool,) = mcp_tools(COUNTER, only=["add"])
    episode: list[asyncio.Task] = []
    accepted: list[bool] = []
    went_on: list[str] = []
    _connection(tool.server, "").queue = _CancelOnAnswer(episode, accepted)  # before it serves

    async def run() -> None:
        await tool.invoke({"amount": 1}, ToolContext(session="a"))
        await asyncio.sleep(0)  # its next turn
        went_on.append("its next turn")

    try:
        episode.append(asyncio.ensure_future(run()))
        with pytest.raises(asyncio.CancelledError):
            await episode[0]
        assert (accepted, went_on) == ([True], [])
    finally:
        await close_connections()


async def test_a_server_that_dies_mid_call_is_the_tools_fault_and_starts_again() -> None:
    """A red-team pass: a run-scoped server that exited in the middle of a call answered that
    call, and every later call of the run, 'Error: Connection closed' as the model's error (not
    the tool's fault), and was never started again."""
    server = McpServer(command=[sys.executable, str(HERE / "mcp_dying_server.py")], timeout_s=30)
    tools = {t.name: t for t in mcp_tools(server)}
    ctx = ToolContext(session="a")
    try:
        first = await tools["pid"].invoke({}, ctx)
        died = await tools["die"].invoke({}, ctx)
        assert died.is_error and died.is_tool_fault, died
        again = await tools["pid"].invoke({}, ctx)
        assert not again.is_error and again.content.isdigit(), again
        assert again.content != first.content  # a new process
    finally:
        await close_connections()


class CounterEnv(ToolEnv):
    tools = mcp_tools(McpServer(command=COUNTER.command, scope="episode"))


async def test_per_episode_servers_keep_their_own_state_and_stop_with_the_episode() -> None:
    a = CounterEnv(Task(id="a", data={"prompt": ""}), ToolContext(session="ep-a"))
    b = CounterEnv(Task(id="b", data={"prompt": ""}), ToolContext(session="ep-b"))
    add = a.tool_map["add"]

    async def add_to(env: CounterEnv, amount: int) -> str:
        call = ToolCall(id="1", name="add", arguments={"amount": amount})
        return (await env.call_tool(call)).content

    assert await add_to(a, 5) == "5"
    assert await add_to(b, 1) == "1"  # its own server
    assert await add_to(a, 1) == "6"
    from agentrl.tools.mcp_tools import _CONNECTIONS

    assert sum(k[0] == add.server.key for k in _CONNECTIONS) == 2
    await a.close()
    await b.close()
    assert not any(k[0] == add.server.key for k in _CONNECTIONS)


@pytest.mark.skipif(shutil.which("mcp-server-git") is None, reason="pip install mcp-server-git")
async def test_the_git_server_from_pypi_reads_a_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first commit"], cwd=repo, check=True)
    (repo / "a.py").write_text("x = 2\n")
    server = McpServer(command=["mcp-server-git", "--repository", str(repo)], timeout_s=60)
    tools = {t.name: t for t in mcp_tools(server)}
    assert {"git_status", "git_diff_unstaged", "git_log"} <= set(tools)
    ctx = ToolContext(session="git")
    try:
        status = await tools["git_status"].invoke({"repo_path": str(repo)}, ctx)
        assert "a.py" in status.content and not status.is_error
        diff = await tools["git_diff_unstaged"].invoke({"repo_path": str(repo)}, ctx)
        assert "-x = 1" in diff.content and "+x = 2" in diff.content
        log = await tools["git_log"].invoke({"repo_path": str(repo)}, ctx)
        assert "first commit" in log.content
        bad = await tools["git_log"].invoke({"repo_path": str(tmp_path / "nowhere")}, ctx)
        assert bad.is_error
    finally:
        await close_connections()
