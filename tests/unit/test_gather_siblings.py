"""When one of several concurrent jobs raises, the others are cancelled and waited for before
the error goes on (agentrl/tool.py: `gather_all`): `asyncio.gather` alone left them running, so
a turn's other tool calls ran on in the sandbox session of an episode already ended by one
call's SandboxUnavailable, a group's other episodes sampled on after one raised a bug to stop
on, and a grade's other test chunks kept the sandbox busy after it had raised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from agentrl.env import AssistantTurn, Env, ToolEnv
from agentrl.oversample import run_groups
from agentrl.rollout import Rollout, RolloutConfig
from agentrl.sandbox.base import ExecResult, SandboxUnavailable
from agentrl.sandbox.checks import CallTest
from agentrl.sandbox.grader import grade
from agentrl.tool import Tool, ToolContext, ToolResult
from agentrl.types import Completion, ConfigError, FinishReason, Message, Task, ToolCall


class Left:
    """What the jobs left running after the error: each adds itself while running."""

    def __init__(self) -> None:
        self.running: set[str] = set()

    async def forever(self, name: str) -> None:
        self.running.add(name)
        try:
            await asyncio.Event().wait()
        finally:
            self.running.discard(name)


LEFT = Left()


class Down(Tool):
    name, description = "down", "its sandbox is down"

    class Args(BaseModel):
        pass

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(0)  # the other call has started
        raise SandboxUnavailable("sandbox at 127.0.0.1:1 refused")


class Slow(Tool):
    name, description = "slow", "runs long in the session"

    class Args(BaseModel):
        pass

    async def __call__(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        await LEFT.forever(f"{ctx.session}: slow call")
        return ToolResult(content="late")


class TwoTools(ToolEnv):
    tools = [Down(), Slow()]


async def test_a_turns_other_calls_stop_when_one_finds_the_sandbox_down() -> None:
    env = TwoTools(Task(id="t", data={}), ToolContext(session="s", timeout_s=60.0))
    calls = [ToolCall(id="1", name="slow"), ToolCall(id="2", name="down")]
    turn = AssistantTurn(Message(role="assistant", tool_calls=calls), "")
    with pytest.raises(SandboxUnavailable):
        await env.step(turn)
    assert LEFT.running == set(), "a call ran on after its episode ended"


class OneTurn:
    async def generate(self, input_ids, params, key=None) -> Completion:
        return Completion([151645], [-0.5], FinishReason.STOP, weight_version="0")


class FirstIsMisconfigured(Env):
    """The group's first episode raises a configuration error (a bug to stop on); the others
    wait in their start."""

    made = 0

    async def start(self) -> list[Message]:
        FirstIsMisconfigured.made += 1
        if FirstIsMisconfigured.made == 1:
            raise ConfigError("env.args.x: a setting that cannot work")
        await LEFT.forever(f"episode {FirstIsMisconfigured.made}")
        return [Message(role="user", content="hi")]

    async def reward(self, trajectory: Any) -> float:
        return 0.0


async def test_a_groups_other_episodes_stop_when_one_raises_a_bug(qwen_tokenizer) -> None:
    FirstIsMisconfigured.made = 0
    ro = Rollout(OneTurn(), qwen_tokenizer, FirstIsMisconfigured, RolloutConfig(group_size=3))
    with pytest.raises(ConfigError):
        await ro.run_group(Task(id="t", data={}))
    assert LEFT.running == set(), "episodes of the group ran on after the error"


async def test_a_steps_other_groups_stop_when_one_raises() -> None:
    async def group(task: Task) -> list:
        if task.id == "bad":
            await asyncio.sleep(0)
            raise ConfigError("a bug to stop on")
        await LEFT.forever(f"group {task.id}")
        return []

    with pytest.raises(ConfigError):
        await run_groups(group, [Task(id="ok", data={}), Task(id="bad", data={})])
    assert LEFT.running == set(), "a group ran on after the error"


class HalfDown:
    """A sandbox whose first call finds it down; the others run long."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, code: str, language: str = "python", timeout: float = 10.0,
                  session: str | None = None) -> ExecResult:  # fmt: skip
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(0)  # the other chunk's call has started
            raise SandboxUnavailable("sandbox at 127.0.0.1:1 refused")
        await LEFT.forever(f"chunk call {self.calls}")
        return ExecResult()


async def test_a_grades_other_chunks_stop_when_one_finds_the_sandbox_down() -> None:
    tests = [CallTest(call="f()", expected=1) for _ in range(2)]
    with pytest.raises(SandboxUnavailable):  # one test per chunk, both at once
        await grade(HalfDown(), "def f(): return 1", tests, timeout_s=1.0, max_call_s=4.5,
                    parallel=2, batch=True)  # fmt: skip
    assert LEFT.running == set(), "a chunk ran on after grade() raised"
