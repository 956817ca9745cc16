"""On the e2b backend a grader's one-shot call runs in an e2b sandbox of its own, never in an
episode's sandbox: with a stand-in for the e2b SDK (no account, no network)."""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentrl.sandbox.base import grading, in_episode


class _Error(Exception):
    pass


@dataclass
class _Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class _Execution:
    logs: _Logs
    error: Any = None
    results: list[Any] = field(default_factory=list)


class FakeBox:
    """An e2b sandbox that says which one ran a call: what code in one sandbox could reach."""

    made: list[FakeBox] = []

    def __init__(self) -> None:
        self.id, self.killed, self.calls = len(FakeBox.made), False, 0
        FakeBox.made.append(self)

    @classmethod
    async def create(cls, **_: Any) -> FakeBox:
        await asyncio.sleep(0)
        return cls()

    async def run_code(self, code: str, **_: Any) -> _Execution:
        assert not self.killed
        self.calls += 1
        await asyncio.sleep(0.01)
        return _Execution(_Logs(stdout=[f"box {self.id}\n"]))

    async def create_code_context(self) -> object:
        return object()

    async def remove_code_context(self, ctx: object) -> None:
        return None

    async def kill(self) -> None:
        self.killed = True


@pytest.fixture
def e2b_sdk(monkeypatch: pytest.MonkeyPatch) -> type[FakeBox]:
    e2b = types.ModuleType("e2b")
    e2b.TimeoutException = e2b.NotFoundException = e2b.SandboxException = _Error  # type: ignore[attr-defined]
    ci = types.ModuleType("e2b_code_interpreter")
    ci.AsyncSandbox = FakeBox  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "e2b", e2b)
    monkeypatch.setitem(sys.modules, "e2b_code_interpreter", ci)
    FakeBox.made = []
    return FakeBox


async def test_a_graders_calls_each_get_an_e2b_sandbox_of_their_own(e2b_sdk) -> None:
    """A red-team pass: every stateless call of the run, the grader's tests of every episode
    among them, shared one e2b sandbox (a VM whose code contexts share its processes and
    files), so a solution of one episode, or the policy's stateless tool call, could leave a
    process there that killed the harness of its group's other episodes' tests (their
    rewards 0: its own advantage up) or read their files. A grader's call now runs in a
    sandbox of its own, killed after it, even one made inside an episode's tool call; the
    episode's one-shot calls run in the episode's sandbox."""
    from agentrl.sandbox.e2b_backend import E2BSandbox

    sb = E2BSandbox()
    with in_episode("task:0:aa"):
        tool = [await sb.run("print(1)", timeout=5.0) for _ in range(2)]
        with grading():
            graded = await asyncio.gather(*(sb.run("print(1)", timeout=5.0) for _ in range(3)))
    await sb.aclose()
    grader_boxes = {r.stdout for r in graded}
    assert len(grader_boxes) == 3 and not grader_boxes & {r.stdout for r in tool}
    assert len({r.stdout for r in tool}) == 1  # the episode's own
    assert all(b.killed for b in e2b_sdk.made) and len(e2b_sdk.made) == 4
