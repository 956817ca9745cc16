"""code_exec with per-turn rewards: the env scores each tool call as it happens.

The first turn whose last `python` call prints exactly the expected answer (its whole output,
trimmed: nothing else on stdout, no stderr, no error) earns `tool_reward` (default 0.3) on that
turn, once per episode; the outcome (1.0 for the exact `<answer>`) lands on the last turn. A call
that prints many candidates (`print(*range(10**4))`) earns nothing, and neither does printing a
hit again: a red-team pass found that the old rule (the answer anywhere among the printed words,
on every turn) paid 1.2 an episode for printing a range of numbers, more than the right answer.
Only the turn's last call counts, as one guess: a later pass found that a turn of 30 calls,
each printing one candidate, was paid whenever any of them was right. Where the answer is
written in the prompt (sort_kth's k-th smallest is one of the listed numbers) no turn earns it:
a policy printing the prompt's numbers one a turn, reading none, was paid 0.3 three times in
ten (the outcome reward still pays the right `<answer>`). Train it
with turn-level credit, where turn k's tokens get the return-to-go from turn k, compared with the
same turn of the other samples of the task (agentrl/advantage.py):

    python -m agentrl.train env=code_exec_turns algo.advantage.reward_level=turn
"""

from __future__ import annotations

import re

from agentrl.env import AssistantTurn, StepResult
from agentrl.envs.code_exec import CodeExecEnv


class CodeExecTurnsEnv(CodeExecEnv):
    tool_reward = 0.3  # the first turn whose last tool output is exactly the expected answer
    _paid = False

    async def step(self, turn: AssistantTurn) -> StepResult:
        result = await super().step(turn)
        if result.tool_calls:
            answer = str(self.task.data["answer"]).strip()
            last = next((m for m in reversed(result.messages) if m.role == "tool"), None)
            hit = not self._paid and last is not None and last.content.strip() == answer
            hit = hit and not in_prompt(answer, str(self.task.data["prompt"]))
            self._paid = self._paid or hit
            result.reward = self.tool_reward if hit else 0.0
        return result


def in_prompt(answer: str, prompt: str) -> bool:
    """Whether `answer` stands in `prompt` as a whole word or number (`-7` in `[3, -7]`, `7` in
    `6 * 7.`; not `7` in `17` or `2.75`): printing the prompt's words finds it without solving."""
    if not answer:
        return False
    return re.search(rf"(?<![\w.]){re.escape(answer)}(?!\w|\.\d)", prompt) is not None
