"""code_exec with per-turn rewards: the env scores each tool call as it happens.

A turn whose `python` call prints the expected answer earns `tool_reward` (default 0.3) on that
turn; the outcome (1.0 for the exact `<answer>`) lands on the last turn. Train it with turn-level
credit, where turn k's tokens get the return-to-go from turn k, compared with the same turn of the
other samples of the task (agentrl/advantage.py):

    python -m agentrl.train env=code_exec_turns algo.advantage.reward_level=turn
"""

from __future__ import annotations

from agentrl.env import AssistantTurn, StepResult
from agentrl.envs.code_exec import CodeExecEnv


class CodeExecTurnsEnv(CodeExecEnv):
    tool_reward = 0.3  # per turn whose tool output contains the expected answer

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        if result.tool_calls:
            answer = str(self.task.data["answer"]).strip()
            printed = [m.content.split() for m in result.messages if m.role == "tool"]
            hit = any(answer in words for words in printed)
            result.reward = self.tool_reward if hit else 0.0
        return result
