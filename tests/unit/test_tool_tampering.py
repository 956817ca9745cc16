"""A tool call whose code attacked its sandbox (the sandbox caught it writing to its control
channel) is the model's error, and said so: `ToolOutcome.tampered`, `tools/<name>/tampered`."""

from __future__ import annotations

import asyncio

from agentrl import Message, Task, ToolEnv
from agentrl.env import AssistantTurn
from agentrl.metrics import rollout_metrics
from agentrl.sandbox.base import ExecResult
from agentrl.tool import ToolContext
from agentrl.tools.python import PythonTool
from agentrl.types import FinishReason, StopReason, ToolCall, Trajectory, Turn


class CaughtSandbox:
    """A sandbox backend that answers as the local service does for code that wrote to its
    control channel (sandbox/worker.py), and runs anything else as nothing."""

    async def run(self, code, language="python", timeout=10.0, session=None):
        if "control" in code:
            return ExecResult(
                stderr="\n[sandbox] killed: the code wrote to the sandbox's control channel "
                "(a frame that is not JSON)\n", exit_code=None, limit="control_channel",
                session_reset=True,
            )  # fmt: skip
        return ExecResult(stdout="ok\n")

    async def close_session(self, session): ...

    async def aclose(self): ...


class PyEnv(ToolEnv):
    tools = [PythonTool()]

    async def reward(self, trajectory):
        return 0.0


def test_a_call_that_attacked_its_sandbox_is_counted_apart() -> None:
    """A red-team pass: code that wrote to the sandbox's control channel was killed and the
    model read so, but the run's metrics counted it as any failed call (tools/python/errors):
    a policy learning to attack its sandbox did not show."""
    ctx = ToolContext(session="s", sandbox=CaughtSandbox())
    env = PyEnv(Task(id="t", data={"prompt": "q"}), ctx)
    calls = [ToolCall(id=str(i), name="python", arguments={"code": c})
             for i, c in enumerate(["print(1)", "# control socket", "1/0 and 'no'"])]  # fmt: skip
    step = asyncio.run(
        env.step(AssistantTurn(Message(role="assistant", content="", tool_calls=calls), ""))
    )
    assert [o.tampered for o in step.tool_outcomes] == [False, True, False]
    assert [o.status for o in step.tool_outcomes] == ["ok", "error", "ok"]
    turn = Turn(2, 4, 5, "0", FinishReason.STOP, Message(role="assistant", content=""),
                num_tool_calls=2, num_tool_errors=1, tool_outcomes=step.tool_outcomes)  # fmt: skip
    tr = Trajectory("t", 0, list(range(5)), [0, 0, 1, 1, 0], [0.0] * 5, 2, [turn],
                    [Message(role="user", content="q")], StopReason.COMPLETED, reward=0.0)  # fmt: skip
    again = Trajectory.from_dict(tr.to_dict())
    assert again.turns[0].tool_outcomes == step.tool_outcomes
    m = rollout_metrics([again])
    assert m["tools/python/tampered"] == 1.0 and m["tools/python/errors"] == 1.0
    honest = Trajectory.from_dict({**tr.to_dict(), "turns": [{**tr.to_dict()["turns"][0],
                                   "tool_outcomes": [{"name": "python"}]}]})  # fmt: skip
    assert "tools/python/tampered" not in rollout_metrics([honest])
