"""code_exec_turns' per-turn reward, through the env's real step and python tool (on the
subprocess sandbox): only a call whose whole output is the answer earns it, once an episode.
A red-team pass found the old rule (the answer among the printed words, every turn) paid
`print(*range(-1000, 11000))` 0.3 a turn, 1.2 an episode: more than answering right; a later
one that a turn of many calls, one candidate each, was paid when any was right."""

from __future__ import annotations

import pytest

from agentrl.env import AssistantTurn
from agentrl.envs.code_exec_turns import CodeExecTurnsEnv
from agentrl.sandbox import SubprocessSandbox
from agentrl.tool import ToolContext
from agentrl.types import Message, Task, ToolCall

TASK = Task(id="t", data={"prompt": "Compute 6 * 7.", "answer": "42"})


def call(code: str) -> AssistantTurn:
    msg = Message(role="assistant", content="", tool_calls=[
        ToolCall(id="1", name="python", arguments={"code": code})])  # fmt: skip
    return AssistantTurn(msg, "")


def calls(codes: list[str]) -> AssistantTurn:
    msg = Message(role="assistant", content="", tool_calls=[
        ToolCall(id=str(i), name="python", arguments={"code": c}) for i, c in enumerate(codes)])  # fmt: skip
    return AssistantTurn(msg, "")


async def rewards(codes: list[str]) -> list[float]:
    env = CodeExecTurnsEnv(TASK, ToolContext(session="t", sandbox=SubprocessSandbox()))
    return [(await env.step(call(code))).reward for code in codes]


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        (["print(6 * 7)"], [0.3]),
        (["print(*range(-1000, 11000))"] * 4, [0.0] * 4),  # many candidates: nothing
        (["print('the answer is', 42)"], [0.0]),
        (["import sys; print(42); print('x', file=sys.stderr)"], [0.0]),
        (["print(41)", "print(6 * 7)", "print(42)", "print(42)"], [0.0, 0.3, 0.0, 0.0]),
    ],
)
async def test_only_the_first_exact_answer_earns_the_turn_reward(codes, expected):
    assert await rewards(codes) == expected


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([f"print({k})" for k in range(30, 60)], 0.0),  # one candidate a call: nothing
        (["print(42)", "print(41)"], 0.0),  # the turn's last call is its one guess
        (["import math", "print(6 * 7)"], 0.3),  # a call that prints nothing, then the answer
    ],
)
async def test_a_turn_of_many_calls_is_one_guess(codes, expected):
    env = CodeExecTurnsEnv(TASK, ToolContext(session="t", sandbox=SubprocessSandbox()))
    assert (await env.step(calls(codes))).reward == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("<answer>1</answer> then <answer>42</answer>", "42"),  # the last one counts
        ("<answer>41<answer>42</answer>", "41<answer>42"),  # from an opener to the next closer
        ("<answer>42", None),
        ("<answer>x" * 8000, None),  # a red-team flood: the regex took 3 s on it
    ],
)
def test_the_last_answer_is_read_in_one_pass(text, expected):
    import re

    from agentrl.envs.code_exec import last_answer

    assert last_answer(text) == expected
    if len(text) < 100:  # what the regex it replaces reads
        found = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        assert (found[-1] if found else None) == expected


async def test_an_answer_written_in_the_prompt_earns_no_turn_reward():
    """A red-team pass: sort_kth's answer is one of the numbers its prompt lists, so a policy
    printing them one a turn, reading none, was paid 0.3 on 3 tasks in 10 (4 turns of 8-15
    numbers); here it prints every one of them, and the honest computation earns nothing either
    (the outcome reward still pays the right <answer>)."""
    import re

    from agentrl.envs.code_exec import generate_tasks

    (task,) = generate_tasks(1, seed=3, kinds=["sort_kth"])
    listed = re.findall(r"-?\d+", task.data["prompt"].split("[")[1])
    assert task.data["answer"] in listed
    env = CodeExecTurnsEnv(task, ToolContext(session="t", sandbox=SubprocessSandbox()))
    paid = [(await env.step(call(f"print({n})"))).reward for n in listed]
    assert paid == [0.0] * len(listed)
    env = CodeExecTurnsEnv(task, ToolContext(session="u", sandbox=SubprocessSandbox()))
    assert (await env.step(call(f"print({task.data['answer']})"))).reward == 0.0


@pytest.mark.parametrize(
    ("answer", "prompt", "expected"),
    [("7", "Compute 6 * 7.", True), ("-7", "in [3, -7, 2]", True), ("7", "in [17, 2.75]", False),
     ("42", "Compute 6 * 7.", False), ("2.5", "x = 2.5", True), ("2", "x = 2.5", False)],
)  # fmt: skip
def test_in_prompt_reads_whole_words_and_numbers(answer, prompt, expected):
    from agentrl.envs.code_exec_turns import in_prompt

    assert in_prompt(answer, prompt) is expected
