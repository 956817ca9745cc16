"""code_exec's format reward pays for an answer given, not for an empty answer tag; no one
answer is right on many of its generated tasks."""

from __future__ import annotations

import math
import random
import re
from collections import Counter

import pytest

from agentrl.envs.code_exec import GENERATORS, CodeExecEnv, generate_tasks
from agentrl.types import Message, StopReason, Task, Trajectory


async def score(text: str) -> dict[str, float]:
    env = CodeExecEnv(Task(id="t", data={"prompt": "Compute 6 * 7.", "answer": "42"}))
    env.format_reward = 0.1
    traj = Trajectory(task_id="t", sample_index=0, token_ids=[], loss_mask=[], logprobs=[],
                      prompt_len=0, turns=[], messages=[Message(role="assistant", content=text)],
                      stop_reason=StopReason.COMPLETED)  # fmt: skip
    return await env.reward(traj)


@pytest.mark.parametrize("text", ["<answer></answer>", "<answer> \n </answer>"])
async def test_an_empty_answer_tag_earns_no_format_reward(text: str) -> None:
    """A red-team pass: '<answer></answer>', no answer at all, was paid format_reward."""
    assert await score(text) == {"total": 0.0, "correct": 0.0, "format": 0.0}


async def test_an_answer_earns_the_format_reward_and_the_right_one_both() -> None:
    assert (await score("<answer>41</answer>"))["total"] == pytest.approx(0.1)
    assert (await score("<answer> 42 </answer>"))["total"] == pytest.approx(1.1)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_no_one_answer_is_paid_on_many_tasks_of_a_kind(kind: str) -> None:
    """A red-team pass: 61% of the gcd questions had the answer 1, so a policy answering
    `<answer>1</answer>` without reading the numbers was paid on them as often."""
    answers = Counter(t.data["answer"] for t in generate_tasks(600, seed=3, kinds=[kind]))
    for prompt, answer in (GENERATORS[kind](random.Random(k)) for k in range(50)):
        if "greatest common divisor" in prompt:
            a, b = map(int, re.findall(r"\d+", prompt))
            assert answer == str(math.gcd(a, b)) and answer != "1"
    assert answers.most_common(1)[0][1] <= 0.1 * 600, answers.most_common(3)
