"""An e2b sandbox's creation (seconds) is not its caller's to cancel: a caller that gives up
during it (its episode dropped) has its own sandbox killed once made, instead of leaving it
running (and billed) until its timeout with nobody holding it; an episode's sandbox is made
once for all its callers (agentrl/sandbox/e2b_backend.py). Against a stand-in
for the e2b SDK that keeps what e2b would: a sandbox exists once its create request arrived."""

from __future__ import annotations

import asyncio
import sys
import types
from types import SimpleNamespace

import pytest

from agentrl.sandbox.base import in_episode

REMOTE: list[Box] = []  # every sandbox e2b runs for us, killed or not


class Box:
    def __init__(self) -> None:
        self.killed = False
        REMOTE.append(self)

    async def run_code(self, code: str, **kw) -> SimpleNamespace:
        return SimpleNamespace(logs=SimpleNamespace(stdout=["ok\n"], stderr=[]), error=None,
                               results=[])  # fmt: skip

    async def kill(self) -> None:
        self.killed = True

    async def create_code_context(self) -> object:
        return object()

    async def remove_code_context(self, ctx: object) -> None:
        return None


class AsyncSandbox:
    hold = asyncio.Event()  # the creation's answer waits for it (a busy e2b)

    @classmethod
    async def create(cls, timeout: int = 0, **kw) -> Box:
        box = Box()  # e2b made it once the request arrived, whether we hear back or not
        await cls.hold.wait()
        return box


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch):
    e2b = types.ModuleType("e2b")
    for name in ("NotFoundException", "TimeoutException", "SandboxException"):
        setattr(e2b, name, type(name, (Exception,), {}))
    monkeypatch.setitem(sys.modules, "e2b", e2b)
    monkeypatch.setitem(
        sys.modules, "e2b_code_interpreter", SimpleNamespace(AsyncSandbox=AsyncSandbox)
    )
    from agentrl.sandbox.e2b_backend import E2BSandbox

    REMOTE.clear()
    AsyncSandbox.hold = asyncio.Event()
    return E2BSandbox(retries=0)


async def _made() -> None:
    while not REMOTE:
        await asyncio.sleep(0)


async def test_a_session_whose_episode_is_dropped_during_creation_leaks_no_sandbox(sandbox):
    call = asyncio.ensure_future(sandbox.run("x = 1", session="a"))
    await _made()
    call.cancel()  # its episode's group is dropped while e2b makes the sandbox
    with pytest.raises(asyncio.CancelledError):
        await call
    await sandbox.close_session("a")  # the episode's close: nothing to close yet
    AsyncSandbox.hold.set()
    await sandbox.aclose()
    assert len(REMOTE) == 1 and REMOTE[0].killed, "a sandbox is left running"


async def test_an_episodes_sandbox_is_made_once_whoever_gives_up(sandbox):
    """Two one-shot calls of one episode (parallel tool calls) share its sandbox's creation:
    the first one's cancellation neither cancels it for the second nor makes a second one."""
    with in_episode("task:0:aa"):  # a tool call's (Tool.invoke): the tasks inherit it
        first = asyncio.ensure_future(sandbox.run("1"))
        await _made()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.ensure_future(sandbox.run("2"))
    AsyncSandbox.hold.set()
    assert (await second).stdout == "ok\n"
    assert len(REMOTE) == 1, "a second sandbox was made for the episode: the first one leaked"
    await sandbox.close_session("task:0:aa")
    assert all(b.killed for b in REMOTE)
    await sandbox.aclose()
