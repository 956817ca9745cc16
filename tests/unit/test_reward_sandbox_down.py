"""A reward whose grading sandbox is down is the infrastructure's failure, not the policy's: the
episode ends `sandbox_unavailable` (out of the batch and its group's baseline, its group rolled
out again), as a tool call that found the sandbox down does. A red-team pass found it scored 0
as `reward_error`, so a right answer graded during an outage taught the policy it was wrong."""

from __future__ import annotations

from agentrl.env import ToolEnv, finish_episode
from agentrl.groups import lost
from agentrl.sandbox.client import ServiceSandbox
from agentrl.sandbox.grader import asserts_to_tests, grade
from agentrl.types import Message, StopReason, Task, Trajectory


class GradedEnv(ToolEnv):
    """Grades the answer's code with the real grader, on a sandbox service that is not there."""

    async def reward(self, trajectory: Trajectory) -> float:
        down = ServiceSandbox("http://127.0.0.1:1", retries=0)  # nothing listens on port 1
        try:
            result = await grade(down, "def candidate(x):\n    return x * x",
                                 asserts_to_tests("assert candidate(2) == 4"), timeout_s=2.0)  # fmt: skip
        finally:
            await down.aclose()
        return float(result.all_passed)


async def test_a_grading_outage_is_sandbox_unavailable_not_a_zero() -> None:
    traj = Trajectory(task_id="t", sample_index=0, token_ids=[], loss_mask=[], logprobs=[],
                      prompt_len=0, turns=[], messages=[Message(role="assistant", content="x")],
                      stop_reason=StopReason.COMPLETED, metadata={"session": "s"})  # fmt: skip
    await finish_episode(GradedEnv(Task(id="t", data={"prompt": "p"})), traj)
    assert traj.stop_reason is StopReason.SANDBOX_UNAVAILABLE, (traj.stop_reason, traj.error)
    assert traj.stop_reason.is_infra_failure and lost(traj)  # its group is rolled out again
    assert traj.reward == 0.0 and traj.error.startswith("reward: SandboxUnavailable")
