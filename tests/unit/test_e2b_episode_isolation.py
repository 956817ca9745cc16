"""On the e2b backend one episode's one-shot tool calls cannot reach another episode's: each
episode's calls run in an e2b sandbox of its own, killed when the episode closes. Against a
stand-in for the e2b SDK (no account, no network) whose sandboxes keep files, as e2b's do: the
code contexts of one sandbox share its filesystem."""

from __future__ import annotations

import asyncio
import sys
import types
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from agentrl.env import ToolEnv
from agentrl.tool import Tool, ToolContext
from agentrl.tools.python import PythonTool
from agentrl.types import Task, ToolCall


class NotFound(Exception):
    pass


class Box:
    """An e2b sandbox. Code is `write PATH TEXT` or `read PATH`; files live in the sandbox."""

    made: ClassVar[list[Box]] = []
    hold: ClassVar[asyncio.Event | None] = None  # when set: creations wait for it (a busy e2b)

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.killed = False
        Box.made.append(self)

    @classmethod
    async def create(cls, **_: Any) -> Box:
        box = cls()  # e2b made it once the request arrived, whether we hear back or not
        if cls.hold is not None:
            await cls.hold.wait()
        return box

    async def run_code(self, code: str, **_: Any) -> SimpleNamespace:
        if self.killed:
            raise NotFound("sandbox not found")
        op, path, *text = code.split(" ", 2)
        out, err = [], None
        if op == "write":
            self.files[path] = text[0]
        elif path in self.files:
            out = [self.files[path] + "\n"]
        else:
            err = SimpleNamespace(name="FileNotFoundError", value=path, traceback="")
        return SimpleNamespace(logs=SimpleNamespace(stdout=out, stderr=[]), error=err, results=[])

    async def create_code_context(self) -> object:
        if self.killed:
            raise NotFound("sandbox not found")
        return object()

    async def remove_code_context(self, ctx: object) -> None:
        return None

    async def kill(self) -> None:
        self.killed = True


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch):
    e2b = types.ModuleType("e2b")
    e2b.NotFoundException = NotFound  # type: ignore[attr-defined]
    e2b.TimeoutException = e2b.SandboxException = type("E2BError", (Exception,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "e2b", e2b)
    monkeypatch.setitem(sys.modules, "e2b_code_interpreter", SimpleNamespace(AsyncSandbox=Box))
    from agentrl.sandbox.e2b_backend import E2BSandbox

    Box.made, Box.hold = [], None
    return E2BSandbox(retries=0)


class OneShotEnv(ToolEnv):
    tools: ClassVar[list[Tool]] = [PythonTool(stateful=False)]


def _episode(sandbox: Any, session: str) -> OneShotEnv:
    task = Task(id="same-task", data={"prompt": "x"})  # a group: one task, several episodes
    return OneShotEnv(task, ToolContext(session=session, sandbox=sandbox, task=task))


async def _python(env: OneShotEnv, code: str) -> str:
    return (await env.call_tool(ToolCall(id="c", name="python", arguments={"code": code}))).content


async def test_one_episodes_one_shot_call_cannot_read_a_file_another_episode_wrote(sandbox):
    """All one-shot calls of the run shared one e2b sandbox: an episode could leave a file
    that its group's other episodes' code read (a reward-hacking path), or read theirs."""
    a, b = _episode(sandbox, "task:0:aa"), _episode(sandbox, "task:1:bb")
    await _python(a, "write /tmp/answer 42")
    assert await _python(a, "read /tmp/answer") == "42"  # the episode's own sandbox keeps it
    assert "42" not in await _python(b, "read /tmp/answer"), "episode b read episode a's file"
    await a.close()
    await b.close()
    await sandbox.aclose()


async def test_an_episodes_sandbox_is_killed_when_the_episode_closes(sandbox):
    """Not at the run's end: an episode's sandbox is billed only while the episode lives."""
    a, b = _episode(sandbox, "task:0:aa"), _episode(sandbox, "task:1:bb")
    await _python(a, "write /tmp/x 1")
    await _python(b, "write /tmp/x 2")
    await a.close()
    await b.close()
    assert Box.made and all(box.killed for box in Box.made), "a closed episode's sandbox runs"
    await sandbox.aclose()


async def test_an_episode_dropped_while_its_sandbox_is_made_leaves_none_running(sandbox):
    Box.hold = asyncio.Event()
    a = _episode(sandbox, "task:0:aa")
    call = asyncio.ensure_future(_python(a, "write /tmp/x 1"))
    while not Box.made:
        await asyncio.sleep(0)
    call.cancel()  # its group is dropped while e2b makes the sandbox
    with pytest.raises(asyncio.CancelledError):
        await call
    await a.close()  # nothing made yet to kill: it is killed once made
    Box.hold.set()
    for _ in range(100):
        if Box.made[0].killed:
            break
        await asyncio.sleep(0)
    assert len(Box.made) == 1 and Box.made[0].killed, "the dropped episode's sandbox runs on"
    await sandbox.aclose()


async def test_calls_no_episode_claims_each_run_in_a_sandbox_killed_after(sandbox):
    await sandbox.run("write /tmp/x 1")
    res = await sandbox.run("read /tmp/x")
    assert res.error_name == "FileNotFoundError"
    await sandbox.aclose()
    assert len(Box.made) == 2 and all(box.killed for box in Box.made)


async def test_a_session_whose_sandbox_a_one_shot_call_renewed_is_told_its_state_is_gone(sandbox):
    """A one-shot call of the episode that found the sandbox expired makes the episode a new
    one; the session's next call runs there and says its REPL state was lost."""
    a = _episode(sandbox, "task:0:aa")
    assert (await sandbox.run("write /tmp/x 1", session="task:0:aa")).ok
    Box.made[0].killed = True  # e2b's sandbox_timeout_s passed
    assert "[no output]" in await _python(a, "write /tmp/y 2")
    res = await sandbox.run("read /tmp/y", session="task:0:aa")
    assert res.session_reset and res.stdout == "2\n" and len(Box.made) == 2
    await a.close()
    assert all(box.killed for box in Box.made)
    await sandbox.aclose()
