"""The tiny model's code_exec dialogues (agentrl/assets/build_tiny.py trains on them), of mixed
quality.

Per task (envs/code_exec.py's generator) one of three behaviours is drawn: call `python` with the
right program and answer with its output (`good`); call it with a plausible wrong program
(parentheses dropped, digits counted instead of summed, gcd for lcm, …) and answer with that
output (`wrong_code`); or answer at once with a guess of the right length (`no_tool`, almost
always wrong). Tool outputs come from running the programs. Same seed, same dialogues.
"""

from __future__ import annotations

import contextlib
import io
import random
import re

from agentrl.assets.toolbox import Example
from agentrl.envs.code_exec import SYSTEM_PROMPT, CodeExecEnv, generate_tasks
from agentrl.types import Message, Task, ToolCall

MODES = {"good": 0.3, "wrong_code": 0.3, "no_tool": 0.4}  # behaviour mixture of the SFT data


def _programs(task: Task) -> tuple[str, str]:
    """(right program, plausible wrong program) for a generated code_exec task."""
    p, kind = task.data["prompt"], task.id.split("-")[0]
    nums = [int(x) for x in re.findall(r"-?\d+", p)]
    if kind == "arith":
        expr = p.removeprefix("Compute ").removesuffix(".")
        if expr.startswith("("):  # (a op b) * c  → a op b * c
            wrong = expr[1:].replace(")", "", 1)
        else:  # a op b * c  → (a op b) * c
            a, op, b, _, c = expr.split()
            wrong = f"({a} {op} {b}) * {c}"
        return f"print({expr})", f"print({wrong})"
    if kind == "digit_sum":
        pw = f"{nums[0]}**{nums[1]}"
        return f"print(sum(int(d) for d in str({pw})))", f"print(len(str({pw})))"
    if kind == "primes":
        prime = "all(k % d for d in range(2, int(k**0.5) + 1))"
        return f"print(sum({prime} for k in range(2, {nums[0]})))", (
            f"print(sum({prime} for k in range({nums[0]})))"
        )
    if kind == "fib_mod":
        n, m = nums[-2], nums[-1]
        loop = f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\n"
        return f"{loop}print(a % {m})", f"{loop}print(b % {m})"
    if kind == "sort_kth":
        k, xs = nums[0], p[p.index("[") : p.index("]") + 1]
        return f"print(sorted({xs})[{k} - 1])", f"print(sorted({xs})[-{k}])"
    if kind == "gcd_lcm":
        a, b = nums
        right, other = ("gcd", "lcm") if "divisor" in p else ("lcm", "gcd")
        return (
            f"import math\nprint(math.{right}({a}, {b}))",
            f"import math\nprint(math.{other}({a}, {b}))",
        )
    raise ValueError(f"no programs for task kind {kind!r}")


def run_program(code: str) -> str:
    """What the `python` tool shows for a program that prints and exits cleanly."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})  # our own generated programs only
    return buf.getvalue().rstrip("\n") or "[no output]"


def _guess(answer: str, rng: random.Random) -> str:
    """A wrong answer of the right shape: same sign, same number of digits."""
    sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
    while True:
        lo = 10 ** (len(digits) - 1) if len(digits) > 1 else 0
        guess = str(rng.randint(lo, 10 ** len(digits) - 1))
        if guess != digits:
            return sign + guess


def dialogue(task: Task, mode: str, rng: random.Random) -> list[tuple[Message, list[Message]]]:
    """The assistant turns of one episode, each with the observations that answer it."""
    if mode == "no_tool":
        answer = _guess(task.data["answer"], rng)
        return [(Message(role="assistant", content=f"<answer>{answer}</answer>"), [])]
    right, wrong = _programs(task)
    code = right if mode == "good" else wrong
    out = run_program(code)
    if mode == "good" and out != task.data["answer"]:
        raise AssertionError(
            f"{task.id}: program printed {out!r}, expected {task.data['answer']!r}"
        )
    call = ToolCall(id="call_0", name="python", arguments={"code": code})
    return [
        (
            Message(role="assistant", content="", tool_calls=[call]),
            [Message(role="tool", content=out, tool_call_id="call_0", name="python")],
        ),
        (Message(role="assistant", content=f"<answer>{out}</answer>"), []),
    ]


def episodes(n: int, seed: int, kinds: list[str] | None = None) -> list[Example]:
    """`n` code_exec dialogues; tasks from code_exec's generator with a seed of their own."""
    rng = random.Random(seed)
    names, weights = list(MODES), list(MODES.values())
    tools = [t.schema() for t in CodeExecEnv.tools]
    out = []
    for task in generate_tasks(n, seed=10_000 + seed, kinds=kinds):
        mode = rng.choices(names, weights)[0]
        turns = dialogue(task, mode, rng)
        out.append(Example(SYSTEM_PROMPT, tools, task.data["prompt"], task.data["answer"], turns))
    return out
