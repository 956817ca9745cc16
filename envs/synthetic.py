"""A synthetic env for benchmarks: fixed prompt length, a fixed number of assistant turns, a
zero-latency "tool" observation after every turn, and a seeded random reward (so GRPO groups have
variance). The model's text is never parsed: any model, random weights included, runs the same
number of turns, which makes step time depend only on the shapes.

    python -m agentrl.train env=custom env._target_=agentrl.envs.synthetic.FixedLengthEnv \
        env.tasks.n=64 env.tasks.prompt_words=120 env.args.turns=4 rollout.max_new_tokens=128
    # a long multi-turn episode: each tool message 5000 words (about one token each)
    ... env.args.turns=4 env.args.observation_words=5000
    # tools that take time: each answer after a lognormal wait, median 200 ms, heavy tail
    ... env.args.tool_latency_ms=200 env.args.tool_latency_sigma=1.0
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import statistics
from typing import Any

from agentrl.env import AssistantTurn, Env, StepResult
from agentrl.types import Message, Task, Trajectory

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "river",
    "stone",
    "cloud",
]


class FixedLengthEnv(Env):
    turns: int = 1  # assistant turns per episode
    observation: str = "ok"  # the tool message after each turn but the last
    observation_words: int = 0  # > 0: the tool message is this many words instead (long contexts)
    # > 0: each tool answer comes after a lognormal wait of this median (ms), its log-space spread
    # tool_latency_sigma (1.0: p90 3.6x, p99 10x the median), drawn from the episode (its session) and turn
    tool_latency_ms: float = 0.0
    tool_latency_sigma: float = 1.0

    @classmethod
    def load_tasks(
        cls, n: int = 64, seed: int = 0, prompt_words: int = 100, **_: Any
    ) -> list[Task]:
        """`n` distinct prompts of `prompt_words` words each (about one token per word)."""
        rng = random.Random(seed)
        return [
            Task(id=f"syn-{i}", data={"prompt": " ".join(rng.choices(_WORDS, k=prompt_words))})
            for i in range(n)
        ]

    async def start(self) -> list[Message]:
        return [Message(role="user", content=self.task.data["prompt"])]

    @staticmethod
    def observation_message(text: str = "ok", words: int = 0) -> Message:
        """The tool message: `text`, or with `words` > 0 that many words (about a token each)."""
        if words > 0:
            text = " ".join(_WORDS[i % len(_WORDS)] for i in range(words))
        return Message(role="tool", content=text, name="noop")

    async def step(self, turn: AssistantTurn) -> StepResult:
        if turn.index + 1 >= self.turns:
            return StepResult(done=True)
        if self.tool_latency_ms > 0:
            await asyncio.sleep(self.tool_latency_s(turn.index))
        return StepResult(
            messages=[self.observation_message(self.observation, self.observation_words)],
            tool_calls=1,
        )

    def tool_latency_s(self, turn: int) -> float:
        """This episode's wait before turn `turn`'s tool answer: lognormal, median
        tool_latency_ms, seeded by the task, the episode's session (unique per run) and the turn."""
        key = f"{self.task.id}/{self.ctx.session}/{turn}".encode()
        u = (int.from_bytes(hashlib.sha256(key).digest()[:8], "big") + 0.5) / 2**64
        z = statistics.NormalDist().inv_cdf(u)  # a standard normal draw
        return self.tool_latency_ms / 1000 * math.exp(self.tool_latency_sigma * z)

    async def reward(self, trajectory: Trajectory) -> float:
        """Uniform in [0, 1), fixed by task and sample (seeded by their ids)."""
        key = f"{trajectory.task_id}/{trajectory.sample_index}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") / 2**32
