"""code_exec: arithmetic and small algorithmic problems solved with a Python tool.

The model may call `python` as often as it likes (up to max_turns), then answers with
`<answer>VALUE</answer>`. Reward: 1.0 when the last answer equals the expected one exactly (after
trimming whitespace), else 0.0, plus `format_reward` (default 0: off) when an answer tag holds
something (an empty one is no answer) — optional shaping for weak starting policies; components
`correct` and `format`.

Tasks come from a seeded generator (`n`, `seed`, `kinds`) or a JSONL file (`path`), one object per
line: {"id": "...", "prompt": "...", "answer": "..."}.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from agentrl.env import ToolEnv
from agentrl.tools.python import PythonTool
from agentrl.types import Task, Trajectory

SYSTEM_PROMPT = (
    "Solve the problem. You can run Python code with the `python` tool; print the values you need. "
    "When you know the result, reply with <answer>RESULT</answer> containing only the final value."
)


def last_answer(text: str) -> str | None:
    """The last `<answer>…</answer>` of `text` (each one from an opener to the next closer), in
    one pass: the regex `<answer>(.*?)</answer>` took 3 s on 8,000 openers without a closer (a
    red-team pass), in the event loop every episode shares."""
    pos, last = 0, None
    while (start := text.find("<answer>", pos)) >= 0:
        end = text.find("</answer>", start + 8)
        if end < 0:
            break
        last, pos = text[start + 8 : end], end + 9
    return last


def _arith(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(10, 999), rng.randint(10, 999), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    apply = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}[op]
    if rng.random() < 0.5:  # precedence: b * c first
        return f"Compute {a} {op} {b} * {c}.", str(apply(a, b * c))
    return f"Compute ({a} {op} {b}) * {c}.", str(apply(a, b) * c)


def _digit_sum(rng: random.Random) -> tuple[str, str]:
    base, exp = rng.randint(2, 9), rng.randint(20, 80)
    return f"What is the sum of the digits of {base}**{exp}?", str(sum(map(int, str(base**exp))))


def _primes(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(50, 3000)
    count = sum(1 for k in range(2, n) if all(k % d for d in range(2, math.isqrt(k) + 1)))
    return f"How many prime numbers are smaller than {n}?", str(count)


def _fib_mod(rng: random.Random) -> tuple[str, str]:
    n, m = rng.randint(30, 300), rng.choice([97, 1000, 1009, 10007])
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return f"Let F(0)=0, F(1)=1, F(k)=F(k-1)+F(k-2). What is F({n}) mod {m}?", str(a % m)


def _sort_kth(rng: random.Random) -> tuple[str, str]:
    xs = [rng.randint(-500, 500) for _ in range(rng.randint(8, 15))]
    k = rng.randint(1, len(xs))
    return f"What is the {k}-th smallest number in {xs}? (1-based)", str(sorted(xs)[k - 1])


def _gcd_lcm(rng: random.Random) -> tuple[str, str]:
    # the gcd of two random numbers is 1 six times in ten: a red-team policy that answered 1
    # without reading the numbers was paid that often; a common factor `g` spreads the answers
    g = rng.randint(2, 999)
    a, b = rng.randint(100, 99999), rng.randint(100, 99999)
    if rng.random() < 0.5:
        a, b = g * (a // 100), g * (b // 100)
        return f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b))
    return f"What is the least common multiple of {a} and {b}?", str(a * b // math.gcd(a, b))


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "arith": _arith,
    "digit_sum": _digit_sum,
    "primes": _primes,
    "fib_mod": _fib_mod,
    "sort_kth": _sort_kth,
    "gcd_lcm": _gcd_lcm,
}


def generate_tasks(n: int, seed: int = 0, kinds: list[str] | None = None) -> list[Task]:
    if kinds is not None and not kinds:  # read as "all" before, silently
        raise ValueError(f"kinds=[] names no kind: give some of {sorted(GENERATORS)}, or leave "
                         "it out (null) for all of them")  # fmt: skip
    kinds = kinds or sorted(GENERATORS)
    unknown = set(kinds) - set(GENERATORS)
    if unknown:
        raise ValueError(
            f"unknown code_exec task kinds {sorted(unknown)}; known: {sorted(GENERATORS)}"
        )
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        prompt, answer = GENERATORS[kind](rng)
        tasks.append(Task(id=f"{kind}-{seed}-{i}", data={"prompt": prompt, "answer": answer}))
    return tasks


def check_answer(task: Task, path: str) -> Task:
    """A task of a file whose `answer` the reward can compare with the model's text: a string,
    or an integer (its digits). Else a ValueError: without one every episode's reward raised;
    a float (`2.0`, as pandas writes integers beside a missing value) or true was compared as
    its Python text ("2.0", "True") and never matched; null, a list or an object neither."""
    answer = task.data.get("answer")
    if isinstance(answer, str) or (isinstance(answer, int) and not isinstance(answer, bool)):
        return task
    what = "has no 'answer'" if "answer" not in task.data else f"has the answer {answer!r:.60}"
    raise ValueError(f"{path}: task {task.id!r} {what}: give each task an 'answer', the text the "
                     "model must reply in <answer></answer> (a string, or an integer)")  # fmt: skip


class CodeExecEnv(ToolEnv):
    tools = [PythonTool()]
    max_turns = 4
    system_prompt = SYSTEM_PROMPT
    format_reward = 0.0

    @classmethod
    def load_tasks(
        cls,
        path: str | None = None,
        n: int = 256,
        seed: int = 0,
        kinds: list[str] | None = None,
        limit: int | None = None,
        **_: Any,
    ) -> list[Task]:
        if path is not None:
            return [check_answer(t, path) for t in super().load_tasks(path=path, limit=limit)]
        if limit is not None and limit < 1:
            raise ValueError(f"limit={limit}: give 1 or more, or leave it out for all n={n}")
        return generate_tasks(n, seed, kinds)[:limit]  # limit: the first of them, as of a file

    async def reward(self, trajectory: Trajectory) -> dict[str, float]:
        answer = last_answer(self.final_text(trajectory))
        given = answer.strip() if answer is not None else None
        correct = float(given is not None and given == str(self.task.data["answer"]).strip())
        fmt = float(bool(given))  # an empty <answer></answer> is no answer: no format reward
        return {"total": correct + self.format_reward * fmt, "correct": correct, "format": fmt}
